#!/bin/bash
# Reward 1 when /app/hello.txt holds exactly "hello" (a trailing newline is fine).
mkdir -p /logs/verifier
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "hello" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "hello.txt missing or wrong: $(head -c 200 /app/hello.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
