#!/bin/bash
# Reward 1 when /app/todo.txt was renamed to /app/moon.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/todo.txt ] && [ "$(cat /app/moon.txt 2>/dev/null)" = "todo" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
