#!/bin/bash
set -euo pipefail
rm /app/todo.txt
