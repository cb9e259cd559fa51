#!/bin/bash
# Reward 1 when /app/music.txt was renamed to /app/star.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/music.txt ] && [ "$(cat /app/star.txt 2>/dev/null)" = "music" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
