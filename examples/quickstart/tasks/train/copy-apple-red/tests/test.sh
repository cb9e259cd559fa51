#!/bin/bash
# Reward 1 when /app/red.txt is a copy of /app/apple.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/apple.txt)" = "apple" ] && [ "$(cat /app/red.txt 2>/dev/null)" = "apple" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
