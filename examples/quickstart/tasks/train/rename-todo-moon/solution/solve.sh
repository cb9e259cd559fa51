#!/bin/bash
set -euo pipefail
mv /app/todo.txt /app/moon.txt
