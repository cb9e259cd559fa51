#!/bin/bash
set -euo pipefail
mkdir /app/plan
