#!/bin/bash
# Reward 1 when /app/todo.txt has its first line kept and moon as its last line.
mkdir -p /logs/verifier
if [ "$(head -n1 /app/todo.txt)" = "first" ] && [ "$(tail -n1 /app/todo.txt)" = "moon" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
