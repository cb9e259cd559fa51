#!/bin/bash
# Reward 1 when /app/list.txt was renamed to /app/fish.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/list.txt ] && [ "$(cat /app/fish.txt 2>/dev/null)" = "list" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
