#!/bin/bash
set -euo pipefail
rm /app/music.txt
