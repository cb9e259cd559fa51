#!/bin/sh
# Give the repository a real history: v1 (correct median), then the commit that broke it.
set -eu
cd /app
buggy=$(mktemp)
cp stats/core.py "$buggy"
cp /tmp/history/core_v1.py stats/core.py
git init -q -b main
git config user.name "Stats Dev"
git config user.email "dev@stats.invalid"
git add -A
git commit -q -m "Add stats package: mean, median, mode, variance"
cp "$buggy" stats/core.py
git commit -q -am "Simplify median"
git config --unset user.name
git config --unset user.email
rm -f "$buggy"
