#!/bin/bash
# Reward 1 when /app/count.txt holds the line count of the original data file.
mkdir -p /logs/verifier
expected=137
got="$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)"
if [ "$got" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected $expected, got '${got}'"
  echo 0 > /logs/verifier/reward.txt
fi
