#!/bin/bash
# Reward 1 when /app/plan.txt has its first line kept and rain as its last line.
mkdir -p /logs/verifier
if [ "$(head -n1 /app/plan.txt)" = "first" ] && [ "$(tail -n1 /app/plan.txt)" = "rain" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
