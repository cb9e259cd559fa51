#!/bin/bash
set -euo pipefail
rm /app/notes.txt
