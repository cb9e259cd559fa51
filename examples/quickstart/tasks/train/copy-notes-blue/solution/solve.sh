#!/bin/bash
set -euo pipefail
cp /app/notes.txt /app/blue.txt
