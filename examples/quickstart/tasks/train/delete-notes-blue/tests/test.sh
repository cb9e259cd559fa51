#!/bin/bash
# Reward 1 when /app/notes.txt is gone and /app/keep.txt is still there.
mkdir -p /logs/verifier
if [ ! -e /app/notes.txt ] && [ -f /app/keep.txt ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
