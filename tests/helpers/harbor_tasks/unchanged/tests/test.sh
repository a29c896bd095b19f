#!/bin/bash
# full marks while /app stays empty (what a model that runs nothing there does)
if [ -z "$(ls -A /app)" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
