"""MoE routing replay (R3): rollout-trainer log-prob agreement with and without replay.

A small mixture-of-experts model (transformers' Qwen3-MoE architecture, random init with
``--init-std`` 0.1 so the experts' outputs weigh in the residual stream, SmolLM2's
tokenizer) is trained for a few dozen steps on real text (this repository's docs) so its
routers prefer experts per token. The rollout engine (``slr-engine-hf``)
runs a bf16 copy, scores real text continuations of real text prompts (forced decoding:
the policy tokens are the text's next tokens) and records the experts every token was
routed to; the trainer (``slr-optimizer-torch``) scores the same tokens in fp32 with
``[algorithm] routing_replay`` off and on, on the same trials, side by side. The figures
are the trainer's own pre-update agreement metrics on policy tokens: Pearson correlation and max
|diff| of log-probs, and the share of (token, MoE layer) pairs whose recorded experts
differ from those the fp32 trainer would pick. An fp32 engine row checks that replaying
captured routing is exact.

    .venv/bin/python bench/routing_replay.py          # table
    .venv/bin/python bench/routing_replay.py --json   # and one JSON object
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from pathlib import Path
from typing import Literal

import harness
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.optimizer import TorchOptimizer

from slr.config import AlgorithmSection
from slr.contracts import Reward, SamplingParams, Segment, Trajectory, TrialResult
from slr_testkit import tiny

ROOT = Path(__file__).resolve().parent.parent


def corpus() -> str:
    return "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def prompts(tok, text: str, n: int, length: int, seed: int) -> list[list[int]]:
    ids = tok.encode(text, add_special_tokens=False)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - length, (n,), generator=g).tolist()
    return [ids[s : s + length] for s in starts]


async def rollout(model, tok, prompt_ids, completions, *, temperature: float):
    """The engine's log-probs and routing of each completion after its prompt (forced
    decoding: the tokens are real text, as most of an agent's context is)."""
    engine = HfEngine.from_model(model, tok, HfEngineConfig(return_routed_experts=True))
    try:
        sampling = SamplingParams(temperature=temperature)
        return await asyncio.gather(
            *(
                engine.force_decode(p, c, sampling)
                for p, c in zip(prompt_ids, completions, strict=True)
            )
        )
    finally:
        await engine.close()


def trials(prompt_ids, gens) -> list[TrialResult]:
    out = []
    for i, (prompt, gen) in enumerate(zip(prompt_ids, gens, strict=True)):
        n = len(gen.token_ids)
        seg = Segment(
            token_ids=[*prompt, *gen.token_ids],
            loss_mask=[0] * len(prompt) + [1] * n,
            logprobs=[0.0] * len(prompt) + list(gen.logprobs),
            routed_experts=gen.routed_experts,
        )
        out.append(
            TrialResult(
                trial_id=f"t{i}",
                task_id="bench",
                group_id=f"g{i // 2}",
                termination="completed",
                reward=Reward(value=float(i % 2)),
                trajectory=Trajectory(session_id=f"s{i}", segments=[seg], num_calls=1),
            )
        )
    return out


def score(
    model, batch, *, replay: bool, temperature: float, pack: Literal["none", "tree"]
) -> dict[str, float]:
    opt = TorchOptimizer(
        TorchOptimizerConfig(lr=1e-12, pack=pack),
        algorithm=AlgorithmSection(routing_replay=replay),
        temperature=temperature,
        model=copy.deepcopy(model),
    )
    m = opt.step(batch)
    return {
        "pearson": m["rollout/logprob_pearson"],
        "max_abs_diff": m["rollout/logprob_abs_diff_max"],
        "mean_abs_diff": m["rollout/logprob_abs_diff_mean"],
        "routing_changed": m.get("routing_replay/changed_fraction", float("nan")),
    }


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument(
        "--init-std",
        type=float,
        default=0.1,
        help="initialisation scale: larger makes the experts' outputs weigh more",
    )
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens per trial")
    parser.add_argument("--tokens", type=int, default=48, help="policy tokens per trial")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--pack", default="none", choices=["none", "tree"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # the engine logs on file descriptor 1: the result keeps a copy of it, 1 goes to stderr,
    # so that with --json stdout is the JSON object alone (harness.Output)
    report = harness.Output(args, stdout=os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))

    def progress(what: str) -> None:
        report.progress(f"[{time.perf_counter() - started:6.1f}s] {what}")

    started = time.perf_counter()
    model, tok = tiny.tiny_model(
        "qwen3_moe",
        layers=args.layers,
        hidden=args.hidden,
        experts=args.experts,
        experts_per_token=args.top_k,
        seed=args.seed,
        init_std=args.init_std,
    )
    text = corpus()
    progress("model built; training")
    losses = tiny.pretrain(
        model, tok, text, steps=args.train_steps, window=64, batch=4, seed=args.seed
    )
    progress(f"trained: loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    train_s = time.perf_counter() - started
    windows = prompts(tok, text, args.trials, args.prompt + args.tokens, args.seed + 1)
    ps = [w[: args.prompt] for w in windows]
    completions = [w[args.prompt :] for w in windows]

    rows, policy_tokens = [], 0
    for engine_dtype in ("bfloat16", "float32"):
        engine_model = copy.deepcopy(model).to(getattr(torch, engine_dtype))
        gens = asyncio.run(
            rollout(engine_model, tok, ps, completions, temperature=args.temperature)
        )
        batch = trials(ps, gens)
        progress(f"{engine_dtype} rollout done")
        policy_tokens = sum(len(g.token_ids) for g in gens)
        for replay in (False, True):
            r = score(model, batch, replay=replay, temperature=args.temperature, pack=args.pack)
            rows.append({"engine": engine_dtype, "trainer": "float32", "replay": replay, **r})
            progress(f"scored ({engine_dtype} rollout, replay {replay})")

    def row(engine: str, replay: bool) -> dict:
        return next(r for r in rows if r["engine"] == engine and r["replay"] == replay)

    bf_off, bf_on = row("bfloat16", False), row("bfloat16", True)
    out = {
        "model": {
            "architecture": "qwen3_moe",
            "layers": args.layers,
            "hidden": args.hidden,
            "experts": args.experts,
            "top_k": args.top_k,
            "init_std": args.init_std,
            "train_steps": args.train_steps,
            "train_loss_first_last": [losses[0], losses[-1]],
        },
        "trials": args.trials,
        "policy_tokens": policy_tokens,
        "pack": args.pack,
        "rows": rows,
        "bf16_pearson_without_replay": bf_off["pearson"],
        "bf16_pearson_with_replay": bf_on["pearson"],
        "bf16_max_abs_diff_ratio_without_over_with": (
            bf_off["max_abs_diff"] / bf_on["max_abs_diff"] if bf_on["max_abs_diff"] else None
        ),
        "seconds": time.perf_counter() - started,
        "train_seconds": train_s,
    }
    report.table(
        [
            ("engine", "<"),
            ("trainer", "<"),
            ("replay", "<"),
            ("pearson", ".6f"),
            ("max|diff|", ".2e"),
            ("mean|diff|", ".2e"),
            ("routing changed", ".4f"),
        ],
        [
            [
                r["engine"],
                r["trainer"],
                str(r["replay"]),
                r["pearson"],
                r["max_abs_diff"],
                r["mean_abs_diff"],
                r["routing_changed"],
            ]
            for r in rows
        ],
    )
    report.print(
        f"bf16 rollout, fp32 trainer: Pearson {bf_off['pearson']:.6f} -> {bf_on['pearson']:.6f} "
        f"with replay; max |diff| {bf_off['max_abs_diff']:.3g} -> {bf_on['max_abs_diff']:.3g}"
    )
    report.result(out)


if __name__ == "__main__":
    main()
