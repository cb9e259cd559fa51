#!/bin/bash
# Reward 1 when /app/star.txt is a copy of /app/music.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/music.txt)" = "music" ] && [ "$(cat /app/star.txt 2>/dev/null)" = "music" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
