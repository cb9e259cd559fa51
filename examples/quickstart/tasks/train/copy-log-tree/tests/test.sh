#!/bin/bash
# Reward 1 when /app/tree.txt is a copy of /app/log.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/log.txt)" = "log" ] && [ "$(cat /app/tree.txt 2>/dev/null)" = "log" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
