#!/bin/bash
# Reward 1 when /app/notes.txt holds exactly the word blue.
mkdir -p /logs/verifier
if [ -f /app/notes.txt ] && [ "$(cat /app/notes.txt)" = "blue" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
