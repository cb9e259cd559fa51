#!/bin/bash
# Reward 1 when /app/report.txt holds exactly the word sun.
mkdir -p /logs/verifier
if [ -f /app/report.txt ] && [ "$(cat /app/report.txt)" = "sun" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
