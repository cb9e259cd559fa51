#!/bin/bash
set -euo pipefail
rm /app/list.txt
