#!/bin/bash
set -euo pipefail
echo moon > /app/todo.txt
