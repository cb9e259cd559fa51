#!/bin/bash
# Reward 1 when /app/apple.txt was renamed to /app/red.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/apple.txt ] && [ "$(cat /app/red.txt 2>/dev/null)" = "apple" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
