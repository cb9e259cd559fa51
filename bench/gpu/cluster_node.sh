#!/usr/bin/env bash
# A short asynchronous training run on ONE GPU node: an SGLang or vLLM server as the
# engine, verl's trainer as the optimizer (slr-optimizer-verl), mini-swe-agent on the
# bundled example tasks in local sandboxes. For users with a GPU node; what it needs is in
# bench/gpu/README.md. Run from a checkout with `slr` installed:
#
#     ENGINE=sglang MODEL=/models/Qwen3-0.6B bash bench/gpu/cluster_node.sh [slr run args...]
#
# ENGINE        sglang (default) or vllm
# MODEL         a local model folder (required; nothing is downloaded)
# ENGINE_PYTHON the Python that has SGLang installed (ENGINE=sglang; default: python)
# OPTIMIZER     verl (default) or torch (the embedded trainer, if verl is not installed)
# WEIGHT_UPDATE ENGINE=sglang: disk (default), tensor (shared memory / CUDA IPC: the
#               trainer and the server share this node) or distributed (an nccl group:
#               needs the engine and the trainer on different GPUs)
# STEPS         optimizer steps (default 3)
# SLR           the slr command (default: .venv/bin/slr, else slr on PATH)
#
# Without a GPU (or without the engine, the optimizer plugin or MODEL) it stops at once,
# saying what is missing, before anything starts.
#
# SLR_GPU_DRY_RUN=1: a dry run on any machine: no GPU and no engine install are checked
# (GPUS, default 1, stands in for nvidia-smi's count), the config is written and checked
# by `slr preflight --structure-only` with the arguments given, and the commands the run
# would make are printed instead of run.
set -euo pipefail
cd "$(dirname "$0")/../.."
DRY_RUN="${SLR_GPU_DRY_RUN:-0}"

ENGINE="${ENGINE:-sglang}"
OPTIMIZER="${OPTIMIZER:-verl}"
STEPS="${STEPS:-3}"
ENGINE_PYTHON="${ENGINE_PYTHON:-python}"
WEIGHT_UPDATE="${WEIGHT_UPDATE:-disk}"
SLR="${SLR:-$( [ -x .venv/bin/slr ] && echo .venv/bin/slr || echo slr )}"
fail() { echo "cluster_node.sh: $*" >&2; exit 2; }

# 1. the machine: GPUs first (the cheapest check that most often fails)
if [ "$DRY_RUN" = 1 ]; then
  gpus="${GPUS:-1}"
  echo "cluster_node.sh: dry run (SLR_GPU_DRY_RUN=1): $gpus GPU(s) assumed; nothing is started"
else
  command -v nvidia-smi >/dev/null 2>&1 || fail "no GPU: nvidia-smi is not on PATH. Run this on a GPU node."
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l || true)
  [ "${gpus:-0}" -ge 1 ] || fail "no GPU: nvidia-smi lists no device. Run this on a GPU node."
fi
command -v "$SLR" >/dev/null 2>&1 || fail "slr is not installed ($SLR): pip install slr, or bash scripts/setup in this checkout."

# 2. what the run uses
[ -n "${MODEL:-}" ] || fail "set MODEL to a local model folder, e.g. MODEL=/models/Qwen3-0.6B"
[ -f "$MODEL/config.json" ] || fail "MODEL=$MODEL is not a model folder (no config.json there)."
case "$ENGINE" in
  sglang)
    [ "$DRY_RUN" = 1 ] || "$ENGINE_PYTHON" -c "import sglang" 2>/dev/null \
      || fail "SGLang does not import in $ENGINE_PYTHON: pip install sglang there, or set ENGINE_PYTHON." ;;
  vllm)
    [ "$DRY_RUN" = 1 ] || command -v vllm >/dev/null 2>&1 \
      || fail "vllm is not on PATH: pip install vllm (or ENGINE=sglang)." ;;
  *) fail "ENGINE=$ENGINE: use sglang or vllm" ;;
esac
plugins=$("$SLR" plugins 2>/dev/null || true)
grep -qw "$ENGINE" <<<"$plugins" \
  || fail "the '$ENGINE' engine plugin is not installed: pip install slr-engine-$ENGINE"
grep -qw "$OPTIMIZER" <<<"$plugins" \
  || fail "the '$OPTIMIZER' optimizer plugin is not installed: pip install slr-optimizer-$OPTIMIZER (or OPTIMIZER=torch)"

# 3. the GPUs: the engine on GPU 0; the trainer on GPU 1 when there is one, else beside
#    the engine (which then takes half the memory). The trainer, torch or verl, runs in
#    slr's own process on its first visible GPU ("cuda"), so slr runs with only GPU 1
#    visible; the engine's server is launched with CUDA_VISIBLE_DEVICES=0
#    ([engine] gpus_per_replica, set for the server whatever slr's own is).
if [ "$gpus" -ge 2 ]; then
  export CUDA_VISIBLE_DEVICES=1; trainer_gpu=1; share=0.85
else
  export CUDA_VISIBLE_DEVICES=0; trainer_gpu=0; share=0.45
fi
if [ "$ENGINE" = sglang ]; then
  case "$WEIGHT_UPDATE" in
    disk|tensor) ;;
    distributed) [ "$gpus" -ge 2 ] || fail "WEIGHT_UPDATE=distributed needs two GPUs (nccl cannot join two ranks on one): use tensor or disk." ;;
    *) fail "WEIGHT_UPDATE=$WEIGHT_UPDATE: use disk, tensor or distributed" ;;
  esac
  engine_section=$(printf 'name = "sglang"\nmodel = "%s"\npython = "%s"\ngpus_per_replica = ["0"]\nweight_update = "%s"\ntrainer_address = "127.0.0.1"\nextra_args = ["--mem-fraction-static", "%s"]\n' "$MODEL" "$ENGINE_PYTHON" "$WEIGHT_UPDATE" "$share")
else
  engine_section=$(printf 'name = "vllm"\nmodel = "%s"\ngpus_per_replica = ["0"]\nweight_transfer = "nccl"\nextra_args = ["--gpu-memory-utilization", "%s"]\n' "$MODEL" "$share")
fi
# both trainers take these two options (verl: in this process at world_size 1, on cuda)
optimizer_extra=$(printf 'device = "cuda"\ndtype = "bfloat16"\n')
out="${OUT:-runs/cluster-node-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
config="$out/slr.toml"
cat > "$config" <<TOML
# written by bench/gpu/cluster_node.sh
[run]
name = "cluster-node"
mode = "async"
steps = $STEPS
checkpoint_every = $STEPS
runs_dir = "$out"

[tasks]
path = "examples/tasks"

[rollout]
tasks_per_step = 2
n_per_task = 4
concurrency = 8
temperature = 1.0
max_tokens = 512
max_staleness = 1

[algorithm]
adv_estimator = "grpo"
policy_loss = "vanilla"

[agent]
name = "mini-swe-agent"

[backend]
name = "local"

[engine]
$engine_section
[optimizer]
name = "$OPTIMIZER"
model = "$MODEL"
$optimizer_extra

[verifier]
name = "harbor"
TOML
echo "== config: $config (engine $ENGINE on GPU 0, trainer $OPTIMIZER on GPU $trainer_gpu)"
if [ "$DRY_RUN" = 1 ]; then
  # the config and the arguments as slr reads them; the machine checks need the GPU node
  "$SLR" preflight -c "$config" --structure-only "$@"
  echo "dry run: would run, with CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES:"
  echo "  $SLR bundles build mini-swe-agent"
  echo "  $SLR preflight -c $config"
  echo "  $SLR run -c $config $*"
  exit 0
fi
"$SLR" bundles build mini-swe-agent
"$SLR" preflight -c "$config"
"$SLR" run -c "$config" "$@"
