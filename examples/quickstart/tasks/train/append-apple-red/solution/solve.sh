#!/bin/bash
set -euo pipefail
echo red >> /app/apple.txt
