#!/bin/bash
# partial credit, as Reward Kit writes it: /logs/verifier/reward.json
n=0
for f in a b c; do [ -f "/app/$f.txt" ] && n=$((n + 1)); done
awk -v n="$n" 'BEGIN { printf "{\"reward\": %.4f}\n", n / 3 }' > /logs/verifier/reward.json
