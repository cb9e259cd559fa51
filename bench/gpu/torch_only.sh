#!/usr/bin/env bash
# GPU checks for a lent single-GPU machine with only torch installed (no network, a small
# copy of this tree, about 10 minutes). Run from the repository root:
#
#     bash bench/gpu/torch_only.sh [OUT_DIR]
#
# 1. bench/gpu/torch_only.py: bf16 rollout vs fp32 / bf16 trainer log-probs and step times
#    (part A: torch only), then the hf engine and the torch optimizer on CUDA in bf16 when
#    their packages import (part B; skipped with the import error otherwise);
# 2. R3 on a small MoE: bench/routing_replay.py (a CPU bench: bf16 vs fp32 routing), when
#    it and the packages it imports are in this tree, else skipped with the reason.
# Results: OUT_DIR/torch_only.json and OUT_DIR/routing_replay.json (OUT_DIR defaults to
# $OUT, else bench/results/gpu). Without a GPU it stops at once with status 2.
#
# SLR_GPU_DRY_RUN=1: a dry run on any machine: no GPU check, torch_only.py on the CPU
# with --quick, routing_replay.py at its smallest; the same commands, in seconds.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
PYTHON="${PYTHON:-python3}"
OUT_DIR="${1:-${OUT:-bench/results/gpu}}"
DRY_RUN="${SLR_GPU_DRY_RUN:-0}"

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
probe=$?
[ "$DRY_RUN" = 1 ] && [ "$probe" = 1 ] && probe=0  # a dry run needs torch, not a GPU
case $probe in
    0) ;;
    3) echo "torch_only.sh: torch does not import in $PYTHON; install torch (a CUDA build)" >&2
       exit 2 ;;
    *) echo "torch_only.sh: no GPU: torch.cuda.is_available() is false on this machine" \
            "($(command -v nvidia-smi >/dev/null && echo 'nvidia-smi present' || echo 'no nvidia-smi'))." \
            "These checks need one CUDA GPU; run them on a GPU machine." >&2
       exit 2 ;;
esac
mkdir -p "$OUT_DIR"
if [ "$DRY_RUN" = 1 ]; then
    echo "torch_only.sh: dry run (SLR_GPU_DRY_RUN=1): on the CPU, smallest sizes; nothing measured"
    torch_args=(--device cpu --quick)
    replay_args=(--layers 1 --experts 4 --hidden 32 --train-steps 1 --trials 2 --prompt 4 --tokens 2)
else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
    torch_args=(--device cuda)
    replay_args=()
fi

status=0
echo "== 1/2 bf16 rollout vs trainer, step times (bench/gpu/torch_only.py)"
timeout 420 "$PYTHON" bench/gpu/torch_only.py "${torch_args[@]}" --json "$OUT_DIR/torch_only.json" \
    || status=$?

echo "== 2/2 R3 routing replay on a small MoE (bench/routing_replay.py)"
# routing_replay.py's --json is a flag: its JSON object is stdout, alone (the table goes
# to stderr), so stdout is the result file
export PYTHONPATH="core/src:testkit/src:plugins/engine-hf/src:plugins/optimizer-torch/src${PYTHONPATH:+:$PYTHONPATH}"
if [ ! -f bench/routing_replay.py ]; then
    echo "skipped: bench/routing_replay.py is not in this tree"
elif ! missing=$("$PYTHON" -c "import slr_engine_hf.engine, slr_optimizer_torch.optimizer, slr_testkit.tiny" 2>&1); then
    echo "skipped: routing_replay.py's packages do not import here: $(tail -n 1 <<<"$missing")"
elif timeout 150 "$PYTHON" bench/routing_replay.py "${replay_args[@]}" --json \
        >"$OUT_DIR/routing_replay.json.partial"; then
    mv "$OUT_DIR/routing_replay.json.partial" "$OUT_DIR/routing_replay.json"
else
    rc=$?
    rm -f "$OUT_DIR/routing_replay.json.partial"
    echo "routing_replay.py failed (status $rc)"
    status=$rc
fi
exit "$status"
