"""What the proxy adds to a model call: latency and its own CPU.

    python bench/proxy_overhead.py [--engine ray|embedded] [--runs 3] [--concurrency 1 8 32]
                                   [--calls 8] [--turns 50] [--json]

Serves a tiny random model (SmolLM2 tokenizer and template, every call generates exactly
``--max-tokens`` tokens) with the real ``HfEngine`` behind a real proxy. ``--engine ray``
(the default) runs the engine out of the proxy's process, as one replica actor of a local
Ray (``[run] engine_replicas = 1``); ``embedded`` decodes in a thread of the proxy's own
process. It reports, for each of ``--runs`` runs, then the median and spread over them:

* added latency per call at 1, 8 and 32 concurrent sessions: for every call, the client's
  end-to-end time minus the engine's own ``generate`` time for that call (p50 / p99), beside
  the latency of calling the engine directly, and the HTTP floor (the same client's
  ``GET /v1/models`` round trip: SDK + HTTP, no model work). Clients run in a separate process (the openai
  SDK's async client) so their CPU does not count as the proxy's.
* with ``--engine ray``, each setting twice, interleaved: the replica's stream chunked (one
  Ray object carries every token sampled since the proxy took the previous one: today) and
  one Ray object per token (before); ``--stream chunked`` or ``per-token`` runs one only.
* the proxy's own CPU per call (its thread's CPU time: HTTP, parsing, rendering,
  tokenization, capture; the engine computes in its own thread) at turn 1 and turn N of one
  long conversation, beside what a full re-render and re-tokenization would cost at turn N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

QUESTION = (
    "Please look at the next part of the repository and tell me what you find there, briefly. "
)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


# -- client process ---------------------------------------------------------------------------


async def _client(spec):
    import openai

    async def converse(url):
        c = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
        messages, out = [], []
        for i in range(spec["calls"]):
            messages.append({"role": "user", "content": f"{QUESTION}({i})"})
            t = time.perf_counter()
            r = await c.chat.completions.create(
                model="policy", messages=messages, max_tokens=spec["max_tokens"]
            )
            out.append(time.perf_counter() - t)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        floor = []
        for _ in range(spec["calls"]):
            t = time.perf_counter()
            await c.models.list()
            floor.append(time.perf_counter() - t)
        await c.close()
        return out, floor

    return await asyncio.gather(*(converse(u) for u in spec["urls"]))


# -- bench process ----------------------------------------------------------------------------


class TimedEngine:
    def __init__(self, engine):
        self.engine = engine
        self.times: dict[str, list[float]] = {}
        self.chunks: list[int] = []  # chunks per streamed call

    tokenizer = property(lambda self: self.engine.tokenizer)
    max_context = property(lambda self: self.engine.max_context)
    weights_version = property(lambda self: self.engine.weights_version)

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        t = time.perf_counter()
        gen = await self.engine.generate(prompt_ids, sampling, session_id=session_id)
        self.times.setdefault(session_id, []).append(time.perf_counter() - t)
        return gen

    async def stream(self, prompt_ids, sampling, *, session_id=None):
        t = time.perf_counter()
        n = 0
        async for chunk in self.engine.stream(prompt_ids, sampling, session_id=session_id):
            n += 1
            if chunk.finish_reason is not None:  # the consumer stops at the final chunk
                self.times.setdefault(session_id, []).append(time.perf_counter() - t)
                self.chunks.append(n)
            yield chunk


def start_engine(kind: str, model, tok, folder):
    """The engine under test: the embedded one, or one Ray replica actor loading ``folder``."""
    if kind == "embedded":
        from slr_engine_hf.engine import HfEngine

        return HfEngine.from_model(model, tok)
    from slr.config import load_config
    from slr.plugins import get_plugin_manager
    from slr.runtime.engines import start_engine_replicas

    data = {
        "run": {"engine_replicas": 1, "engine_resources": {"CPU": 1}},
        "engine": {"name": "hf", "model": str(folder), "threads": 1},
    }
    config = load_config(data=data, plugins=get_plugin_manager(), only_plugins=("engine",))
    return start_engine_replicas(config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["ray", "embedded"], default="ray")
    ap.add_argument("--runs", type=int, default=3, help="repeat the latency part, for spread")
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--calls", type=int, default=8, help="calls per session")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--stream",
        choices=["both", "chunked", "per-token"],
        default="both",
        help="ray: how a replica's stream reaches the proxy (both: side by side)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for this process (GIL hand-over between the proxy's loop "
        "and the engine's thread; Python's default is 0.005 s)",
    )
    ap.add_argument("--client", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.client:
        print(json.dumps(asyncio.run(_client(json.loads(args.client)))))
        return

    import tempfile

    import torch
    from slr_engine_hf.tiny import save, tiny_model

    from slr.config import ProxySection
    from slr.contracts import SamplingParams
    from slr.proxy import Proxy, ProxyThread
    from slr.proxy.messages import Message

    torch.set_num_threads(1)
    model, tok = tiny_model(max_context=8192)
    folder = save(model, tok, tempfile.mkdtemp(prefix="slr-bench-") + "/model")
    engine = start_engine(args.engine, model, tok, folder)
    timed = TimedEngine(engine)
    sampling = SamplingParams(max_tokens=args.max_tokens, stop_token_ids=())
    proxy = Proxy(timed, ProxySection(), sampling=SamplingParams(max_tokens=args.max_tokens))
    report: dict = {"engine": args.engine, "runs": args.runs}
    per_run: dict[str, list[dict]] = {}
    pt = ProxyThread(proxy)

    async def cpu():
        return time.thread_time()

    modes = ["chunked", "per-token"] if args.stream == "both" else [args.stream]
    if args.engine != "ray":
        modes = ["embedded"]

    def set_mode(mode: str) -> None:
        for _, replica in getattr(engine, "replicas", []):
            replica.chunked = mode != "per-token"

    with pt as p:
        settings = [(r, n, m) for r in range(args.runs) for n in args.concurrency for m in modes]
        for run, n, mode in settings:
            set_mode(mode)
            timed.times.clear()
            timed.chunks.clear()
            sessions = [p.open_session(f"bench-{run}-{n}-{i}") for i in range(n)]
            spec = {
                "urls": [s.openai_base_url for s in sessions],
                "calls": args.calls,
                "max_tokens": args.max_tokens,
            }
            cpu_before = pt.call(cpu())
            out = subprocess.run(
                [sys.executable, __file__, "--client", json.dumps(spec)],
                check=True,
                capture_output=True,
                text=True,
            )
            cpu_total = pt.call(cpu()) - cpu_before
            results = json.loads(out.stdout)
            latencies = [lat for lat, _ in results]
            floor = [x for _, f in results for x in f]
            added, e2e, eng = [], [], []
            for s, lat in zip(sessions, latencies, strict=True):
                times = timed.times[s.engine_id]
                added += [a - b for a, b in zip(lat, times, strict=True)]
                e2e += lat
                eng += times
                p.close_session(s)
            # the same prompts straight to the engine, same concurrency
            text = tok.apply_chat_template(
                [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
            )
            prompts = [tok.encode(text, add_special_tokens=False) for _ in range(n)]

            async def direct(prompts=prompts):
                async def one(ids, sid):
                    out = []
                    for _ in range(args.calls):
                        t = time.perf_counter()
                        await engine.generate(ids, sampling, session_id=sid)
                        out.append(time.perf_counter() - t)
                    return out

                return await asyncio.gather(*(one(ids, f"d{i}") for i, ids in enumerate(prompts)))

            direct_lat = [x for row in pt.call(direct()) for x in row]
            per_run.setdefault(f"{n} sessions, {mode}", []).append(
                {
                    "calls": len(added),
                    "added_ms_p50": round(1000 * pct(added, 50), 2),
                    "added_ms_p99": round(1000 * pct(added, 99), 2),
                    "http_floor_ms_p50": round(1000 * pct(floor, 50), 2),
                    "proxy_thread_cpu_ms_per_request": round(
                        1000 * cpu_total / (len(added) + len(floor)), 2
                    ),
                    "chunks_per_call": round(statistics.mean(timed.chunks or [0]), 2),
                    "proxy_e2e_ms_p50": round(1000 * pct(e2e, 50), 1),
                    "proxy_e2e_ms_p99": round(1000 * pct(e2e, 99), 1),
                    "engine_in_proxy_ms_p50": round(1000 * pct(eng, 50), 1),
                    "direct_engine_ms_p50": round(1000 * pct(direct_lat, 50), 1),
                    "direct_engine_ms_p99": round(1000 * pct(direct_lat, 99), 1),
                }
            )
        for key, runs in per_run.items():
            report[key] = {
                name: {
                    "median": statistics.median(r[name] for r in runs),
                    "min": min(r[name] for r in runs),
                    "max": max(r[name] for r in runs),
                }
                for name in runs[0]
            }

        # CPU of the proxy's own thread per call, over one long conversation
        import openai

        set_mode(modes[0])
        s = p.open_session("bench-long")
        c = openai.OpenAI(base_url=s.openai_base_url, api_key="k", max_retries=0)

        messages, cpu_ms, prompt_tokens = [], [], []
        for i in range(args.turns):
            messages.append({"role": "user", "content": f"{QUESTION}({i})"})
            before = pt.call(cpu())
            r = c.chat.completions.create(
                model="policy", messages=messages, max_tokens=args.max_tokens
            )
            after = pt.call(cpu())
            cpu_ms.append(1000 * (after - before))
            prompt_tokens.append(r.usage.prompt_tokens)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        traj = p.close_session(s)
        history = [Message(role=m["role"], content=m["content"] or "") for m in messages]
        t = time.process_time()
        for _ in range(5):
            proxy.renderer.encode(proxy.renderer.render(history, [], generation_prompt=True))
        full_ms = 1000 * (time.process_time() - t) / 5
        report["long conversation"] = {
            "segments": len(traj.segments),
            "turn_1": {"prompt_tokens": prompt_tokens[0], "proxy_cpu_ms": round(cpu_ms[0], 2)},
            "turns_2_6_median_cpu_ms": round(statistics.median(cpu_ms[1:6]), 2),
            f"turns_{args.turns - 4}_{args.turns}_median_cpu_ms": round(
                statistics.median(cpu_ms[-5:]), 2
            ),
            f"turn_{args.turns}": {
                "prompt_tokens": prompt_tokens[-1],
                "proxy_cpu_ms": round(cpu_ms[-1], 2),
                "full_rerender_and_tokenize_ms": round(full_ms, 2),
            },
        }
    asyncio.run(engine.close())
    if not args.json:
        print_table(report, per_run)
    print(json.dumps(report, indent=None if args.json else 2))


def print_table(report: dict, per_run: dict[str, list[dict]]) -> None:
    print(f"engine: {report['engine']}; {report['runs']} runs (median, min-max over runs)")
    print(
        "| sessions | stream | added p50 ms | added p99 ms | proxy CPU ms/req "
        "| direct engine p50 ms | direct engine p99 ms | chunks per call |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in per_run:
        row = report[key]

        def cell(name, row=row):
            return f"{row[name]['median']:g} ({row[name]['min']:g}-{row[name]['max']:g})"

        sessions, mode = key.split(" sessions, ")
        print(
            f"| {sessions} | {mode} | {cell('added_ms_p50')} | {cell('added_ms_p99')} | "
            f"{cell('proxy_thread_cpu_ms_per_request')} | {cell('direct_engine_ms_p50')} | "
            f"{cell('direct_engine_ms_p99')} | {cell('chunks_per_call')} |"
        )


if __name__ == "__main__":
    main()
