#!/bin/bash
set -euo pipefail
mv /app/music.txt /app/star.txt
