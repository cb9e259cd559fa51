#!/bin/bash
set -euo pipefail
cp /app/apple.txt /app/red.txt
