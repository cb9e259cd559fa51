#!/bin/bash
# Reward 1 when /app/sun.txt is a copy of /app/report.txt, which is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/report.txt)" = "report" ] && [ "$(cat /app/sun.txt 2>/dev/null)" = "report" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
