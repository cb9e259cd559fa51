#!/usr/bin/env bash
# The CPU quickstart, end to end: set up what is missing, measure the base model on the
# held-out tasks, train with GRPO, measure the trained checkpoint, print both side by side.
#
#     bash examples/quickstart/run.sh
#
# About 15 minutes on 2 quiet CPU cores once set up (see README.md next to this file). Extra
# arguments go to `slr run`, e.g. --set run.steps=4. QUICKSTART_K sets the trials per
# held-out task of each evaluation (default 4). QUICKSTART_CONFIG picks the config, e.g.
# examples/quickstart/slr-lora.toml (the LoRA variant).
set -euo pipefail
cd "$(dirname "$0")/../.."
here=examples/quickstart
slr=.venv/bin/slr
k=${QUICKSTART_K:-4}
config=${QUICKSTART_CONFIG:-$here/slr.toml}
out=${QUICKSTART_OUT:-runs/quickstart-$(date -u +%Y%m%d-%H%M%S)}
started=$(date +%s)
stamp() { echo "==> [$(( $(date +%s) - started ))s] $*"; }

# 1. Set up only what the quickstart needs: bubblewrap (its sandboxes), the venv, the model,
#    the mini-swe-agent bundle.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    stamp "installing bubblewrap (the local sandboxes' isolation): apt-get install bubblewrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "The quickstart's sandboxes need bubblewrap, which is not installed. Install it," >&2
    echo "then run this again:  sudo apt-get install bubblewrap   (Fedora: sudo dnf install bubblewrap)" >&2
    exit 1
  fi
fi
if [ ! -x "$slr" ]; then
  stamp "setting up .venv (scripts/setup)"
  bash scripts/setup
fi
stamp "model: $("$slr" models pull | tail -n 1)"
stamp "agent bundle: mini-swe-agent"
"$slr" bundles build mini-swe-agent

mkdir -p "$out"
# Progress bars and logs go to the terminal; every trial, transcript and metric is recorded
# in the run directories under $out.
# 2. The base model on the held-out tasks.
stamp "evaluating the base model on $here/tasks/heldout (k=$k)"
"$slr" eval -c "$config" --tasks $here/tasks/heldout -k "$k" --output "$out/eval-base"

# 3. Train on the training tasks.
stamp "training"
"$slr" run -c "$config" --set "run.runs_dir=\"$out\"" "$@"
run_dir=$(ls -d "$out"/quickstart-* | tail -n 1)

# 4. The trained policy on the same held-out tasks.
stamp "evaluating the trained checkpoint $run_dir (k=$k)"
"$slr" eval -c "$config" --tasks $here/tasks/heldout -k "$k" --checkpoint "$run_dir" \
  --output "$out/eval-trained"

# 5. Side by side.
stamp "done"
.venv/bin/python $here/report.py "$out/eval-base" "$run_dir" "$out/eval-trained"
