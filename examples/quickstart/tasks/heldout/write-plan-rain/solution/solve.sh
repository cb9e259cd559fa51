#!/bin/bash
set -euo pipefail
echo rain > /app/plan.txt
