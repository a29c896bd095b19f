#!/bin/bash
# Harbor's contract: the score goes to /logs/verifier/reward.txt
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "$EXPECTED" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
