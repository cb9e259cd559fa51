#!/bin/bash
set -euo pipefail
rm /app/apple.txt
