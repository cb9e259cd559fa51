#!/bin/bash
# Reward 1 when /app/data.txt was renamed to /app/green.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/data.txt ] && [ "$(cat /app/green.txt 2>/dev/null)" = "data" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
