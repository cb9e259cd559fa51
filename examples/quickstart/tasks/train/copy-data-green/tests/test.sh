#!/bin/bash
# Reward 1 when /app/green.txt is a copy of /app/data.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/data.txt)" = "data" ] && [ "$(cat /app/green.txt 2>/dev/null)" = "data" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
