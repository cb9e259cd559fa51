#!/bin/bash
# Reward 1 when /app/plan.txt holds exactly the word rain.
mkdir -p /logs/verifier
if [ -f /app/plan.txt ] && [ "$(cat /app/plan.txt)" = "rain" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
