#!/bin/bash
set -euo pipefail
cp /app/log.txt /app/tree.txt
