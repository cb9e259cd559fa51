"""Generated tokens per second of the embedded engine at 1, 4, 16 and 32 concurrent sessions,
as ratios to single-stream ``model.generate`` on the same model in the same run.

    .venv/bin/python bench/engine_throughput.py [--model smollm2-135m-instruct]
        [--max-tokens 48] [--threads 0] [--max-batch 32] [--json results.json]

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
import json
import statistics
import time

import torch
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


async def engine_round(engine: HfEngine, concurrency: int, max_tokens: int) -> tuple[float, int]:
    batch = prompts(engine.tokenizer, concurrency)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument(
        "--max-batch", type=int, default=32, help="[engine] max_batch: sequences per step"
    )
    parser.add_argument("--repeats", type=int, default=3, help="paired runs per setting")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument(
        "--compare-cache",
        action="store_true",
        help="also run every engine round on transformers' own DynamicCache (which copies the "
        "whole batch's cache to append each step's token: before), interleaved",
    )
    args = parser.parse_args()

    engine = HfEngine(
        HfEngineConfig(model=args.model, max_batch=args.max_batch, threads=args.threads)
    )
    first = prompts(engine.tokenizer, 1)[0]
    # warm-up: first calls pay one-off allocation costs
    baseline(engine, first, 4)
    asyncio.run(engine_round(engine, 1, 4))

    # Load from other processes drifts; pair each engine round with a baseline run next to
    # it and report medians over --repeats pairs.
    import slr_engine_hf.batch as batch_module

    in_place = batch_module.make_decode_cache
    caches = {"in place": in_place}
    if args.compare_cache:
        caches["copying (before)"] = batch_module.make_cache
    rows, bases = [], []
    for c in [int(x) for x in args.concurrency.split(",")]:
        rates: dict[str, list[float]] = {name: [] for name in caches}
        pair_bases, tokens = [], 0
        for _ in range(args.repeats):
            pair_bases.append(baseline(engine, first, args.max_tokens))
            for name, make in caches.items():
                batch_module.make_decode_cache = make  # type: ignore[assignment]
                rate, tokens = asyncio.run(engine_round(engine, c, args.max_tokens))
                rates[name].append(rate)
            batch_module.make_decode_cache = in_place
        base_c = statistics.median(pair_bases)
        bases.extend(pair_bases)
        for name in caches:
            rate_c = statistics.median(rates[name])
            rows.append(
                {
                    "concurrency": c,
                    "kv_cache": name,
                    "tokens": tokens,
                    "tokens_per_s": rate_c,
                    "generate_tokens_per_s": base_c,
                    "ratio_to_generate": rate_c / base_c,
                }
            )
    base = statistics.median(bases)
    asyncio.run(engine.close())

    print(
        f"median of {args.repeats} paired runs, {args.max_tokens} tokens per session, "
        f"max_batch {args.max_batch}, torch threads: {torch.get_num_threads()}"
    )
    print("sessions  kv cache          tokens/s  model.generate tokens/s (1 stream)  ratio")
    for r in rows:
        print(
            f"{r['concurrency']:>8}  {r['kv_cache']:<16}  {r['tokens_per_s']:>8.1f}  "
            f"{r['generate_tokens_per_s']:>33.1f}  {r['ratio_to_generate']:>5.2f}"
        )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"baseline_tokens_per_s": base, "rounds": rows}, f, indent=2)


if __name__ == "__main__":
    main()
