#!/bin/bash
# Reward 1 when /app/data.txt has its first line kept and green as its last line.
mkdir -p /logs/verifier
if [ "$(head -n1 /app/data.txt)" = "first" ] && [ "$(tail -n1 /app/data.txt)" = "green" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
