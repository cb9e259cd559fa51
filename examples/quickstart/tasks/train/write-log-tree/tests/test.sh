#!/bin/bash
# Reward 1 when /app/log.txt holds exactly the word tree.
mkdir -p /logs/verifier
if [ -f /app/log.txt ] && [ "$(cat /app/log.txt)" = "tree" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
