#!/bin/bash
# Reward 1 when /app/report.txt was renamed to /app/sun.txt (content kept).
mkdir -p /logs/verifier
if [ ! -e /app/report.txt ] && [ "$(cat /app/sun.txt 2>/dev/null)" = "report" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
