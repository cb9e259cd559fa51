#!/bin/bash
# Reward 1 when /app/todo.txt holds exactly the word moon.
mkdir -p /logs/verifier
if [ -f /app/todo.txt ] && [ "$(cat /app/todo.txt)" = "moon" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
