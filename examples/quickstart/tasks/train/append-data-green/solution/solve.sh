#!/bin/bash
set -euo pipefail
echo green >> /app/data.txt
