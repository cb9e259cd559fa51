#!/bin/bash
set -euo pipefail
cp /app/data.txt /app/green.txt
