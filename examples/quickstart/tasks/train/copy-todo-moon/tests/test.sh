#!/bin/bash
# Reward 1 when /app/moon.txt is a copy of /app/todo.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/todo.txt)" = "todo" ] && [ "$(cat /app/moon.txt 2>/dev/null)" = "todo" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
