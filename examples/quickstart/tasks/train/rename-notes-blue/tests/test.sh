#!/bin/bash
# Reward 1 when /app/notes.txt was renamed to /app/blue.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/notes.txt ] && [ "$(cat /app/blue.txt 2>/dev/null)" = "notes" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
