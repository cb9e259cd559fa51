#!/bin/bash
set -euo pipefail
echo hello > /app/hello.txt
