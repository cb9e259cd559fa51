"""Tree vs copies at a real model's size: forward+backward time, memory, exactness; same run.

The policy-token scoring path of ``TorchOptimizer`` (decoder, LM head on policy positions,
log-softmax, backward) on the segments of two long sessions that share a system prompt, each
with compactions (rewrites: the system prompt, a summary, then on) and sub-agents (forks off
the main prefix), as copies (right-padded rows, longest first) and as prefix trees
(``slr_optimizer_torch.packing``), for one micro-batch token budget. Random token ids and
random weights in SmolLM2-135M's shape: the sizes are what matter here; ``tree_packing.py``
runs the real optimizer step on real token ids.

It needs only torch and transformers (a GPU machine without this project installed), so it
loads ``packing.py`` by its path.

    python bench/tree_packing_gpu.py --budget 8192            # cuda, bf16
    python bench/tree_packing_gpu.py --device cpu --small     # a quick check anywhere
"""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

import harness
import torch

_PACKING = Path(__file__).resolve().parents[1] / "plugins/optimizer-torch/src/slr_optimizer_torch"
_spec = importlib.util.spec_from_file_location("tree_packing_module", _PACKING / "packing.py")
assert _spec is not None and _spec.loader is not None
packing = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = packing
_spec.loader.exec_module(packing)


def session(rng: random.Random, vocab: int, system: list[int], turns: int):
    """Rows (ids, loss mask): compactions at turns 10 and 30, sub-agents at 20 and 40."""

    def toks(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    rows, forks = [], []
    ids, mask = [*system, *toks(60)], [0] * (len(system) + 60)
    for turn in range(1, turns + 1):
        reply, obs = toks(rng.randint(20, 60)), toks(rng.randint(40, 120))
        ids, mask = ids + reply + obs, mask + [1] * len(reply) + [0] * len(obs)
        if turn % 20 == 0:  # a sub-agent: the main prefix, its task, four turns
            sub, sub_mask = ids + toks(30), mask + [0] * 30
            for _ in range(4):
                sub, sub_mask = sub + toks(30) + toks(60), sub_mask + [1] * 30 + [0] * 60
            forks.append((sub, sub_mask))
        elif turn % 20 == 10 and turn < turns:  # a compaction
            rows += [(ids, mask), *forks]
            forks = []
            ids, mask = [*system, *toks(120)], [0] * (len(system) + 120)
    return [*rows, (ids, mask), *forks]


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=int, default=8192, help="micro-batch tokens")
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--small", action="store_true", help="a tiny model and session")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    report = harness.Output(args)
    from transformers import AutoModelForCausalLM, LlamaConfig

    dev = torch.device(args.device)
    vocab = 512 if args.small else 49152
    rng = random.Random(0)
    system = [rng.randrange(3, vocab) for _ in range(300 if args.small else 1500)]
    turns = min(args.turns, 20) if args.small else args.turns
    rows = session(rng, vocab, system, turns) + session(rng, vocab, system, turns)
    n, width = len(rows), max(len(r[0]) for r in rows)
    input_ids = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    resp = torch.zeros((n, width - 1))
    for i, (ids, m) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attn[i, : len(ids)] = 1
        resp[i, : len(ids) - 1] = torch.tensor(m[1:], dtype=torch.float)
    lengths = attn.sum(-1)
    every = list(range(n))

    torch.manual_seed(0)
    small = args.small
    model = AutoModelForCausalLM.from_config(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=36 if small else 576,
            intermediate_size=64 if small else 1536,
            num_hidden_layers=2 if small else 30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            # older keywords, taken through transformers' **kwargs
            rope_theta=100000.0,  # pyright: ignore[reportCallIssue]
            attn_implementation="sdpa",  # pyright: ignore[reportCallIssue]
        )
    ).to(dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def score(plan, *, grad: bool) -> torch.Tensor:
        out = torch.zeros_like(resp, device=dev)
        dtype = next(model.parameters()).dtype
        for micro, packed in plan:
            length = int(lengths[micro].max())
            sel = resp[micro, : length - 1].to(dev) > 0
            targets = input_ids[micro, 1:length].to(dev)[sel]
            if packed is None:
                hidden = model.model(
                    input_ids=input_ids[micro, :length].to(dev),
                    attention_mask=attn[micro, :length].to(dev),
                ).last_hidden_state[:, :-1][sel]
            else:
                inputs = packed.model_inputs(dev, dtype, boolean=True)
                where = packed.index[:, :-1].to(dev)[sel]
                hidden = model.model(**inputs).last_hidden_state[0, where]
            lp = torch.log_softmax(model.lm_head(hidden).float(), -1)
            lp = lp.gather(-1, targets[:, None])[:, 0]
            if grad:
                (-lp.sum()).backward()
            block = torch.zeros(sel.shape, device=dev)
            block[sel] = lp.detach()
            out[micro, : length - 1] = block
        return out

    copies: list = []
    current, longest = [], 0
    for r in sorted(every, key=lambda r: -int(lengths[r])):
        if current and max(longest, int(lengths[r])) * (len(current) + 1) > args.budget:
            copies.append((current, None))
            current, longest = [], 0
        current.append(r)
        longest = max(longest, int(lengths[r]))
    copies.append((current, None))
    tree = [
        (m, packing.pack(m, input_ids, lengths))
        for m in packing.plan(every, input_ids, lengths, max_tokens=args.budget)
    ]
    policy = resp.to(dev) > 0
    out: dict = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else str(dev),
        "budget": args.budget,
        "rows": n,
        "unique_tokens": packing.unique_tokens(every, input_ids, lengths),
        "copies": {"tokens": int(lengths.sum()), "micro_batches": len(copies)},
        "tree": {"tokens": sum(p.tokens for _, p in tree), "micro_batches": len(tree)},
    }
    model.eval()
    with torch.no_grad():
        out["fp32_max_abs_diff"] = float(
            (score(copies, grad=False) - score(tree, grad=False))[policy].abs().max()
        )
    if dev.type == "cuda":
        model.to(torch.bfloat16)
        with torch.no_grad():
            gap = (score(copies, grad=False) - score(tree, grad=False))[policy].abs()
        out["bf16_max_abs_diff"], out["bf16_mean_abs_diff"] = float(gap.max()), float(gap.mean())
    for name, plan in (("copies", copies), ("tree", tree)):
        times = []
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.repeats + 1):  # the first is a warm-up
            model.zero_grad(set_to_none=True)
            sync()
            started = time.perf_counter()
            score(plan, grad=True)
            sync()
            times.append(time.perf_counter() - started)
        out[name]["fwd_bwd_s"] = statistics.median(times[1:])
        if dev.type == "cuda":
            out[name]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    out["speedup"] = out["copies"]["fwd_bwd_s"] / out["tree"]["fwd_bwd_s"]
    report.table(
        [("layout", "<"), "tokens", "micro-batches", ("fwd+bwd s", ".3f"), ("peak GiB", ".1f")],
        [
            [name, r["tokens"], r["micro_batches"], r["fwd_bwd_s"], r.get("peak_gib")]
            for name, r in ((name, out[name]) for name in ("copies", "tree"))
        ],
        title=f"{out['device']}, budget {args.budget}, {n} rows, "
        f"{out['unique_tokens']} unique tokens",
    )
    report.print(
        f"copies / tree: {out['speedup']:.2f}x; fp32 max |diff| {out['fp32_max_abs_diff']:.1e}"
    )
    report.result(out)


if __name__ == "__main__":
    main()
