#!/bin/bash
set -euo pipefail
mv /app/plan.txt /app/rain.txt
