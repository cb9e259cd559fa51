#!/bin/bash
set -euo pipefail
mv /app/apple.txt /app/red.txt
