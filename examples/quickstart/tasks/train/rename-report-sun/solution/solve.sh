#!/bin/bash
set -euo pipefail
mv /app/report.txt /app/sun.txt
