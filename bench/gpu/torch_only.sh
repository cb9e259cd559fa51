#!/usr/bin/env bash
# GPU checks for a lent single-GPU machine with only torch installed (no network, a small
# copy of this tree, about 10 minutes). Run from the repository root:
#
#     bash bench/gpu/torch_only.sh [OUT_DIR]
#
# 1. bench/gpu/torch_only.py: bf16 rollout vs fp32 / bf16 trainer log-probs and step times
#    (part A: torch only), then the hf engine and the torch optimizer on CUDA in bf16 when
#    their packages import (part B; skipped with the import error otherwise);
# 2. R3 on a small MoE: bench/routing_replay.py when it exists in this tree, else skipped
#    with a message.
# Results: OUT_DIR/torch_only.json and OUT_DIR/routing_replay.json (OUT_DIR defaults to
# $OUT, else bench/results/gpu). Without a GPU it stops at once with status 2.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
PYTHON="${PYTHON:-python3}"
OUT_DIR="${1:-${OUT:-bench/results/gpu}}"
mkdir -p "$OUT_DIR"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "torch_only.sh: $PYTHON not found; set PYTHON to an interpreter with torch" >&2
    exit 2
fi
# one interpreter start (importing torch takes seconds): 0 = a GPU, 3 = no torch, 1 = no GPU
"$PYTHON" -c "
import sys
try:
    import torch
except ImportError:
    sys.exit(3)
sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
case $? in
    0) ;;
    3) echo "torch_only.sh: torch does not import in $PYTHON; install torch (a CUDA build)" >&2
       exit 2 ;;
    *) echo "torch_only.sh: no GPU: torch.cuda.is_available() is false on this machine" \
            "($(command -v nvidia-smi >/dev/null && echo 'nvidia-smi present' || echo 'no nvidia-smi'))." \
            "These checks need one CUDA GPU; run them on a GPU machine." >&2
       exit 2 ;;
esac
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

status=0
echo "== 1/2 bf16 rollout vs trainer, step times (bench/gpu/torch_only.py)"
timeout 420 "$PYTHON" bench/gpu/torch_only.py --json "$OUT_DIR/torch_only.json" || status=$?

echo "== 2/2 R3 routing replay on a small MoE (bench/routing_replay.py)"
if [ -f bench/routing_replay.py ]; then
    # pass only the options that script has (it is built by another change)
    args=()
    grep -q -- '--device' bench/routing_replay.py && args+=(--device cuda)
    grep -q -- '--json' bench/routing_replay.py && args+=(--json "$OUT_DIR/routing_replay.json")
    PYTHONPATH="core/src:plugins/engine-hf/src:plugins/optimizer-torch/src${PYTHONPATH:+:$PYTHONPATH}" \
        timeout 150 "$PYTHON" bench/routing_replay.py "${args[@]}" \
        || { rc=$?; echo "routing_replay.py failed (status $rc)"; status=$rc; }
else
    echo "skipped: bench/routing_replay.py is not in this tree (R3 is built separately;" \
         "rerun this script once it is merged)"
fi
exit "$status"
