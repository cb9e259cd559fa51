#!/bin/bash
set -euo pipefail
cp /app/plan.txt /app/rain.txt
