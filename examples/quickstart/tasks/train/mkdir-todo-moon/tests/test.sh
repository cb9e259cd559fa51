#!/bin/bash
# Reward 1 when /app/todo is a directory.
mkdir -p /logs/verifier
if [ -d /app/todo ] && [ ! -L /app/todo ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
