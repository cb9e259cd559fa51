#!/bin/bash
# Reward 1 when /app/rain.txt is a copy of /app/plan.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/plan.txt)" = "plan" ] && [ "$(cat /app/rain.txt 2>/dev/null)" = "plan" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
