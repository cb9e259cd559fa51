#!/bin/bash
set -euo pipefail
echo sun > /app/report.txt
