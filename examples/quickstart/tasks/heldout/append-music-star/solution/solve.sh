#!/bin/bash
set -euo pipefail
echo star >> /app/music.txt
