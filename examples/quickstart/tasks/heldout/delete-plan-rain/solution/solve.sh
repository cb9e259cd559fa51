#!/bin/bash
set -euo pipefail
rm /app/plan.txt
