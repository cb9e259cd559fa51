#!/bin/bash
set -euo pipefail
echo blue >> /app/notes.txt
