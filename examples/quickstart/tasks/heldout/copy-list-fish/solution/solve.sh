#!/bin/bash
set -euo pipefail
cp /app/list.txt /app/fish.txt
