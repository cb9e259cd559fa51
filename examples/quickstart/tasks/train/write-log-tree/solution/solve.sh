#!/bin/bash
set -euo pipefail
echo tree > /app/log.txt
