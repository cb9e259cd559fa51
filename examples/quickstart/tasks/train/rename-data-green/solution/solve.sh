#!/bin/bash
set -euo pipefail
mv /app/data.txt /app/green.txt
