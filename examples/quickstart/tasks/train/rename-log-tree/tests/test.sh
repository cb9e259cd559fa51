#!/bin/bash
# Reward 1 when /app/log.txt was renamed to /app/tree.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/log.txt ] && [ "$(cat /app/tree.txt 2>/dev/null)" = "log" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
