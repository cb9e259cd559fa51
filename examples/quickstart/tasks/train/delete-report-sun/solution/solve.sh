#!/bin/bash
set -euo pipefail
rm /app/report.txt
