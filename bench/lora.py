"""LoRA vs full-weight training: trainer memory and weight-sync bytes per step, one run.

Each variant runs in its own fresh process (so its peak RSS is its own), one after the
other on the same machine: the torch optimizer on the same model and the same batch
(``--groups`` groups of ``--trials`` trials of ``--tokens`` tokens, half of them policy
tokens, rewards alternating), ``--steps`` steps, then ``export_weights()`` as the loop
sends it to the engines.

    .venv/bin/python bench/lora.py                                 # SmolLM2-135M (packaged)
    .venv/bin/python bench/lora.py --model tiny --json             # a tiny random Llama
    .venv/bin/python bench/lora.py --rank 16 --target-modules q_proj,v_proj

Reported per variant: parameters and trainable parameters, parameter bytes, AdamW state
bytes, bytes one weight sync sends (``sync/bytes``), the process's peak RSS, the step time;
and LoRA / full ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import TYPE_CHECKING, cast

import harness

if TYPE_CHECKING:
    from transformers import PreTrainedModel

VARIANTS = ("full", "lora")


def _trials(groups: int, trials: int, tokens: int, vocab: int):
    import random

    from slr_optimizer_torch.testing import trial

    rng = random.Random(0)
    out = []
    half = tokens // 2
    for g in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(half)]
        for i in range(trials):
            reply = [rng.randrange(vocab) for _ in range(tokens - half)]
            seg = (
                prompt + reply,
                [0] * half + [1] * len(reply),
                [0.0] * half + [-2.0] * len(reply),
            )
            out.append(trial(f"t{g}-{i}", f"g{g}", [seg], float(i % 2)))
    return out


def _state_bytes(optim) -> int:
    import torch

    return sum(
        v.numel() * v.element_size()
        for state in optim.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def run_variant(args: argparse.Namespace) -> dict:
    """One variant in this process (the parent starts one process per variant)."""
    import torch
    from slr_optimizer_torch.config import TorchOptimizerConfig
    from slr_optimizer_torch.optimizer import TorchOptimizer
    from slr_optimizer_torch.testing import tiny_causal_lm

    from slr.config import AlgorithmSection
    from slr.contracts.weights import sync_metrics

    torch.set_num_threads(args.threads)
    targets = args.target_modules.split(",") if "," in args.target_modules else args.target_modules
    options = TorchOptimizerConfig(
        model="" if args.model == "tiny" else args.model,
        lr=1e-4,
        lora_rank=args.rank if args.variant == "lora" else 0,
        lora_alpha=2.0 * args.rank,
        target_modules=targets,
        micro_batch_tokens=args.micro_batch_tokens,
    )
    model = (
        cast("PreTrainedModel", tiny_causal_lm(vocab_size=512, hidden_size=128, layers=4))
        if args.model == "tiny"
        else None
    )
    opt = TorchOptimizer(options, algorithm=AlgorithmSection(), temperature=1.0, model=model)
    vocab = int(opt.model.config.vocab_size)
    batch = _trials(args.groups, args.trials, args.tokens, vocab)
    step_s = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.step(batch)
        step_s.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    weights = opt.export_weights()
    export_s = time.perf_counter() - t0
    params = list(opt.model.parameters())
    return {
        "variant": args.variant,
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in opt.params),
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "optimizer_state_bytes": _state_bytes(opt.optim),
        "sync_bytes": int(sync_metrics(weights)["sync/bytes"]),
        "sync_tensors": len(weights),
        "export_s": export_s,
        "peak_rss_bytes": int(harness.rss_mb(peak=True) * 2**20),
        "step_s": min(step_s),
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="or 'tiny'")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--target-modules", default="all-linear")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # a child: one variant, its result as JSON on the last line
        print(json.dumps(run_variant(args)))
        return
    report = harness.Output(args)

    results = {}
    for variant in VARIANTS:
        argv = [sys.executable, __file__, *sys.argv[1:], "--variant", variant]
        argv = [a for a in argv if a != "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"the {variant} variant failed:\n{done.stderr[-3000:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    ratios = {
        k: lora[k] / full[k]
        for k in (
            "trainable_params",
            "optimizer_state_bytes",
            "sync_bytes",
            "peak_rss_bytes",
            "step_s",
        )
        if full[k]
    }
    out = {
        "model": args.model,
        "rank": args.rank,
        "target_modules": args.target_modules,
        "batch": {"groups": args.groups, "trials": args.trials, "tokens": args.tokens},
        "full": full,
        "lora": lora,
        "lora_over_full": ratios,
    }
    rows = [
        ("parameters", f"{full['params']:,}", f"{lora['params']:,}", ""),
        ("trainable", f"{full['trainable_params']:,}", f"{lora['trainable_params']:,}",
         f"{ratios['trainable_params']:.4f}"),
        ("parameter bytes", _mib(full["param_bytes"]), _mib(lora["param_bytes"]), ""),
        ("AdamW state", _mib(full["optimizer_state_bytes"]), _mib(lora["optimizer_state_bytes"]),
         f"{ratios['optimizer_state_bytes']:.4f}"),
        ("sync bytes / step", _mib(full["sync_bytes"]), _mib(lora["sync_bytes"]),
         f"{ratios['sync_bytes']:.4f}"),
        ("sync tensors", str(full["sync_tensors"]), str(lora["sync_tensors"]), ""),
        ("peak RSS", _mib(full["peak_rss_bytes"]), _mib(lora["peak_rss_bytes"]),
         f"{ratios['peak_rss_bytes']:.3f}"),
        ("step (best of runs)", f"{full['step_s']:.2f} s", f"{lora['step_s']:.2f} s",
         f"{ratios['step_s']:.3f}"),
    ]  # fmt: skip
    report.table(
        [("", "<"), ("full", ">"), ("lora", ">"), ("lora/full", ">")],
        rows,
        title=f"model {args.model}, LoRA rank {args.rank} on {args.target_modules}, batch "
        f"{args.groups}x{args.trials} trials x {args.tokens} tokens",
    )
    report.result(out)


if __name__ == "__main__":
    main()
