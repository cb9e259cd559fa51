#!/bin/bash
set -euo pipefail
mv /app/log.txt /app/tree.txt
