#!/bin/bash
set -euo pipefail
mv /app/list.txt /app/fish.txt
