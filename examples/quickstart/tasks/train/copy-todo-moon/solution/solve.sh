#!/bin/bash
set -euo pipefail
cp /app/todo.txt /app/moon.txt
