#!/bin/bash
# Reward 1 when /app/output is a directory (not a file, not a link to elsewhere).
mkdir -p /logs/verifier
if [ -d /app/output ] && [ ! -L /app/output ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "/app/output is not a directory: $(ls -ld /app/output 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
