#!/bin/bash
set -euo pipefail
mv /app/notes.txt /app/blue.txt
