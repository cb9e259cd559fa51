#!/bin/bash
# Reward 1 when the hidden tests and the repository's own tests pass and the repository's
# tests are untouched (compared with the real HEAD, which the verifier phase restores).
mkdir -p /logs/verifier
cd /app || exit 1
fail=0
if ! git diff --quiet HEAD -- tests/; then
  echo "the repository's tests were modified:"; git diff --stat HEAD -- tests/
  fail=1
fi
python3 -m unittest discover -s tests -v || fail=1
PYTHONPATH=/app python3 -m unittest discover -s /tests -p 'test_hidden.py' -v || fail=1
if [ "$fail" = 0 ]; then reward=1.0; else reward=0.0; fi
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
