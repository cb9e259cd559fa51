"""Fused vs unfused log-probs: peak memory and time of one scoring + backward pass, same run.

The torch optimizer's ``Scorer`` scores one sequence whose every position predicts a policy
token (the worst case: a long reply), with log-probs and entropy both in the loss, then
runs the backward. ``unfused`` is ``[optimizer] use_fused_kernels = false`` (the head's
logits over the policy positions, ``tokens x vocabulary`` in float32, and verl's
log-softmax and entropy on them); ``fused`` is ``true`` (verl's ``FusedLinearForPPO``, 512
positions a chunk, logits recomputed in the backward).

Each measurement runs in a fresh process, so its peak is its own: on the CPU the peak
resident set (``VmHWM``, reset just before the pass) less the resident set just before the pass, on a GPU
``torch.cuda.max_memory_allocated`` less the allocation before it. The two modes alternate
at each length. The model is a random Llama-architecture model with SmolLM2's shape of head
(vocabulary 49152, hidden 576) and ``--layers`` decoder layers.

    .venv/bin/python bench/fused_logprobs.py                     # 512, 2048, 4096 tokens
    .venv/bin/python bench/fused_logprobs.py --tokens 1024 --json
    .venv/bin/python bench/fused_logprobs.py --device cuda       # on a GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import harness

MODES = ("unfused", "fused")


def _model(args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=max(args.tokens) + 1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(args.device).eval()


def worker(args: argparse.Namespace) -> dict:
    """One pass in this process: its peak memory above the start, and its time."""
    import torch
    from slr_optimizer_torch.model import Scorer

    device = torch.device(args.device)
    model = _model(args)
    scorer = Scorer(model, temperature=0.7, fused=args.mode == "fused")
    n = args.tokens[0]
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (1, n), generator=gen).to(device)
    mask = torch.ones_like(ids)
    response = torch.ones((1, n - 1), device=device)
    cuda = device.type == "cuda"
    times, peaks = [], []
    for _ in range(args.repeat):
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        # MiB: the allocator's figure on a GPU, the resident set on the CPU
        before = torch.cuda.memory_allocated() / 2**20 if cuda else harness.reset_peak_rss()
        t0 = time.perf_counter()
        s = scorer(ids, mask, response, entropy=True, entropy_grad=True)
        assert s.entropy is not None
        loss = -(s.logprobs.sum() + 0.01 * s.entropy.sum())
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peaks.append(
            (torch.cuda.max_memory_allocated() / 2**20 if cuda else harness.rss_mb(peak=True))
            - before
        )
        del s, loss
    return {"peak_mib": max(peaks), "time_s": min(times)}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2, help="passes per process (min time)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a worker process
    args = parser.parse_args()
    if args.mode:  # to the parent, which reads the last line
        print(json.dumps(worker(args)))
        return
    out = harness.Output(args)

    rows = []
    for n in args.tokens:
        row: dict = {"tokens": n}
        for mode in MODES:
            cmd = [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--tokens",
                str(n),
                "--vocab",
                str(args.vocab),
                "--hidden",
                str(args.hidden),
                "--layers",
                str(args.layers),
                "--device",
                args.device,
                "--repeat",
                str(args.repeat),
            ]
            stdout = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row[mode] = json.loads(stdout.strip().splitlines()[-1])
        row["memory_ratio"] = row["unfused"]["peak_mib"] / max(row["fused"]["peak_mib"], 1e-9)
        row["time_ratio"] = row["fused"]["time_s"] / row["unfused"]["time_s"]
        rows.append(row)

    out.table(
        [
            "tokens",
            ("unfused MiB", ".0f"),
            ("fused MiB", ".0f"),
            ("mem ratio", lambda v: f"{v:.1f}x"),
            ("unfused s", ".2f"),
            ("fused s", ".2f"),
            ("time ratio", harness.ratio),
        ],
        [
            [
                r["tokens"],
                r["unfused"]["peak_mib"],
                r["fused"]["peak_mib"],
                r["memory_ratio"],
                r["unfused"]["time_s"],
                r["fused"]["time_s"],
                r["time_ratio"],
            ]
            for r in rows
        ],
        title=f"vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers, {args.device}; "
        "one scoring + backward pass, every position a policy token",
    )
    config = {k: getattr(args, k) for k in ("vocab", "hidden", "layers", "device")}
    out.result({"config": config, "rows": rows})


if __name__ == "__main__":
    main()
