#!/bin/bash
set -euo pipefail
cp /app/music.txt /app/star.txt
