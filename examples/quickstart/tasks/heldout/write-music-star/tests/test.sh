#!/bin/bash
# Reward 1 when /app/music.txt holds exactly the word star.
mkdir -p /logs/verifier
if [ -f /app/music.txt ] && [ "$(cat /app/music.txt)" = "star" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
