#!/bin/bash
set -euo pipefail
rm /app/log.txt
