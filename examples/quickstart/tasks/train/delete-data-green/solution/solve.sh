#!/bin/bash
set -euo pipefail
rm /app/data.txt
