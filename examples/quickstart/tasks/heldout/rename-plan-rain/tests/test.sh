#!/bin/bash
# Reward 1 when /app/plan.txt was renamed to /app/rain.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/plan.txt ] && [ "$(cat /app/rain.txt 2>/dev/null)" = "plan" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
