#!/bin/bash
# Reward 1 when /app/data.txt holds exactly the word green.
mkdir -p /logs/verifier
if [ -f /app/data.txt ] && [ "$(cat /app/data.txt)" = "green" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
