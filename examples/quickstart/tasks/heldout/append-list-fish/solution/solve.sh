#!/bin/bash
set -euo pipefail
echo fish >> /app/list.txt
