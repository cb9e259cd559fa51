#!/bin/bash
# Reward 1 when /app/list.txt holds exactly the word fish.
mkdir -p /logs/verifier
if [ -f /app/list.txt ] && [ "$(cat /app/list.txt)" = "fish" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
