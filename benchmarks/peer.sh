#!/usr/bin/env bash
# The peer benchmark: TRL (and accelerate) into .peer/, beside .venv and not a dependency of grpo-ray, then
# benchmarks/peer.py with the arguments given (e.g. --steps 3 --out benchmarks/results/peer).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
[ -d .peer/trl ] || .venv/bin/python -m pip install -q --no-deps --target .peer trl==1.16.0 accelerate==1.15.0
exec .venv/bin/python benchmarks/peer.py "$@"
