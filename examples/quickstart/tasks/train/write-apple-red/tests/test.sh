#!/bin/bash
# Reward 1 when /app/apple.txt holds exactly the word red.
mkdir -p /logs/verifier
if [ -f /app/apple.txt ] && [ "$(cat /app/apple.txt)" = "red" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
