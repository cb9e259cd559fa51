#!/bin/bash
# Reward 1 when /app/fish.txt is a copy of /app/list.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/list.txt)" = "list" ] && [ "$(cat /app/fish.txt 2>/dev/null)" = "list" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
