"""Streaming through the proxy: time to the first text vs time to the whole answer.

    .venv/bin/python bench/streaming.py                     # tiny random model, 200 tokens
    .venv/bin/python bench/streaming.py --model smollm2-135m-instruct --json

A real ``HfEngine`` behind a real proxy, called with the official ``openai`` and
``anthropic`` SDKs from a separate process (as an agent calls it), each call generating exactly ``--tokens`` tokens (a random model does not
stop early; the proxy's sampling caps it). For each API, streaming and non-streaming calls
alternate (``--reps`` of each, so load drift hits both alike) and the client records when the
first piece of text arrived and when the answer was complete. With true streaming the first
text arrives after about one token's time, a small fraction of the whole; without it the
first text is the whole answer (ratio 1.0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import harness

PROMPT = "Tell me a long story about a robot who learns to write code."


def _openai_call(urls: dict, stream: bool) -> tuple[float, float, int]:
    import openai

    c = openai.OpenAI(base_url=urls["openai"], api_key="k", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    t0 = time.perf_counter()
    if not stream:
        r = c.chat.completions.create(model="policy", messages=messages)
        done = time.perf_counter() - t0
        assert r.usage is not None
        return done, done, r.usage.completion_tokens
    first, tokens = None, 0
    for chunk in c.chat.completions.create(
        model="policy", messages=messages, stream=True, stream_options={"include_usage": True}
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    done = time.perf_counter() - t0
    return (first if first is not None else done), done, tokens


def _anthropic_call(urls: dict, stream: bool, max_tokens: int) -> tuple[float, float, int]:
    import anthropic

    c = anthropic.Anthropic(base_url=urls["anthropic"], api_key="k", max_retries=0)
    kw = dict(model="policy", max_tokens=max_tokens, messages=[{"role": "user", "content": PROMPT}])
    t0 = time.perf_counter()
    if not stream:
        m = c.messages.create(**kw)  # type: ignore[arg-type]
        done = time.perf_counter() - t0
        return done, done, m.usage.output_tokens
    first = None
    with c.messages.stream(**kw) as s:  # type: ignore[arg-type]
        for _ in s.text_stream:
            if first is None:
                first = time.perf_counter() - t0
        final = s.get_final_message()
    done = time.perf_counter() - t0
    return (first if first is not None else done), done, final.usage.output_tokens


def _engine(name: str):
    if name == "tiny":
        from slr_engine_hf.engine import HfEngine

        from slr_testkit.tiny import tiny_model

        model, tok = tiny_model(hidden=256, layers=4, heads=4, kv_heads=2, seed=1)
        return HfEngine.from_model(model, tok)
    from slr.plugins import get_plugin_manager

    registration = get_plugin_manager().get("engine", "hf")
    assert registration.config_cls is not None
    return registration.create(registration.config_cls(model=name))


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--model", default="tiny", help="tiny (random) or a model the hf engine loads")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per answer")
    ap.add_argument("--reps", type=int, default=3, help="calls per API and mode")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tokens < 1 or args.reps < 1:
        ap.error("--tokens and --reps must be >= 1")
    if args.client:
        urls = json.loads(args.client)
        _openai_call(urls, True)  # warm-up: first-call costs out of the figures
        out: dict[str, list] = {}
        for _ in range(args.reps):  # alternating, so load drift hits both alike
            for stream in (True, False):
                flag = "true" if stream else "false"
                out.setdefault(f"openai:{flag}", []).append(_openai_call(urls, stream))
                out.setdefault(f"anthropic:{flag}", []).append(
                    _anthropic_call(urls, stream, args.tokens)
                )
        print(json.dumps(out))  # to the parent, which reads the last line
        return

    import asyncio

    import torch

    from slr import log
    from slr.config import ProxySection
    from slr.contracts import SamplingParams
    from slr.proxy import Proxy, ProxyThread

    log.configure(level="warning")  # logs on stderr; stdout is the table or the JSON
    torch.set_num_threads(1)
    engine = _engine(args.model)
    sampling = SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=0)
    proxy = Proxy(engine, ProxySection(model_names=["policy"]), sampling=sampling)
    with ProxyThread(proxy):
        session = proxy.open_session("bench-streaming")
        urls = {"openai": session.openai_base_url, "anthropic": session.anthropic_base_url}
        # The client runs in its own process, as an agent does: its SDK parsing every chunk
        # must not compete for this process's GIL with the proxy and the engine.
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--client",
                json.dumps(urls),
                "--reps",
                str(args.reps),
                "--tokens",
                str(args.tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        proxy.close_session(session)
    asyncio.run(engine.close())
    runs = {
        (api, stream == "true"): calls
        for key, calls in json.loads(child.stdout.strip().splitlines()[-1]).items()
        for api, stream in [key.split(":")]
    }

    rows = []
    for (api, stream), calls in runs.items():
        first = statistics.median(c[0] for c in calls)
        whole = statistics.median(c[1] for c in calls)
        rows.append(
            {
                "api": api,
                "stream": stream,
                "tokens": min(c[2] for c in calls),
                "first_text_s": round(first, 3),
                "whole_answer_s": round(whole, 3),
                "first_over_whole": round(first / whole, 3),
            }
        )
    rows.sort(key=lambda r: (r["api"], not r["stream"]))
    report = {"model": args.model, "tokens": args.tokens, "reps": args.reps, "rows": rows}
    output = harness.Output(args)
    keys = list(rows[0])
    output.table(keys, [[r[k] for k in keys] for r in rows])
    output.result(report)


if __name__ == "__main__":
    main()
