#!/bin/bash
# The oracle: restore the even-length branch of median.
set -euo pipefail
cd /app
python3 - <<'PY'
import re
path = "stats/core.py"
src = open(path).read()
fixed = src.replace(
    "    return values[len(values) // 2]\n",
    "    mid = len(values) // 2\n"
    "    if len(values) % 2:\n"
    "        return values[mid]\n"
    "    return (values[mid - 1] + values[mid]) / 2\n",
)
assert fixed != src, "median body not found"
open(path, "w").write(fixed)
PY
python3 -m unittest discover -s tests -q
