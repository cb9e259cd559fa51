#!/bin/bash
# Reward 1 when /app/notes is a directory.
mkdir -p /logs/verifier
if [ -d /app/notes ] && [ ! -L /app/notes ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
