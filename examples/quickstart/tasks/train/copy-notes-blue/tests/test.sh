#!/bin/bash
# Reward 1 when /app/blue.txt is a copy of /app/notes.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/notes.txt)" = "notes" ] && [ "$(cat /app/blue.txt 2>/dev/null)" = "notes" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
