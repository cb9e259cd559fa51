"""What the proxy adds to a model call: latency, where it goes, and the proxy's own CPU.

    python bench/proxy_overhead.py [--engine ray|embedded] [--repeat 3] [--concurrency 1 8 32]
                                   [--variants before after] [--calls 8] [--turns 50] [--json]

Serves a tiny random model (SmolLM2 tokenizer and template, every call generates exactly
``--max-tokens`` tokens) with the real ``HfEngine`` behind a real proxy. ``--engine ray``
(the default) runs the engine out of the proxy's process, as a replica actor of a local
Ray (``[run] engine_replicas = 1``); ``embedded`` decodes in a thread of the proxy's own
process. Each setting (sessions x variant) runs ``--repeat`` times, interleaved, and the
report gives the median and the spread (min-max) over the repeats:

* added latency per call at 1, 8 and 32 concurrent sessions: for every call, the client's
  end-to-end time minus the engine's own ``generate`` time for that call (p50 / p99),
  beside the latency of calling the engine directly (same prompts, same concurrency, from
  the proxy's loop), and the HTTP floor (the same client's ``GET /v1/models``: SDK + HTTP,
  no model work). Clients run in a separate process (the openai SDK's async client) so
  their CPU does not count as the proxy's.
* where each call's time went, hop by hop (p50 / p99 over calls): client to proxy (the
  SDK builds and sends the request, the proxy's loop takes it), parse (body, routing,
  decoding), the session's lock, prepare (chat template, tokenization, prefix reuse), the
  engine (submit to last token), record and write (the reply built, recorded, sent), and
  proxy to client (the SDK reads and parses it). Stamps are ``time.perf_counter`` in each
  process (the system's monotonic clock, shared by processes on Linux).
* with ``--engine ray``, two variants side by side in one run, each its own replica:
  ``before`` (``generate`` collects the replica's chunked stream: several Ray objects per
  call, each reported, acknowledged and awaited on the proxy's loop) and ``after`` (one
  actor call per ``generate``: one reply). The replicas' CPU priority (nice) is reported.
* the proxy process's CPU per call (all its threads: the proxy's loop and, with Ray, the
  driver's own threads) and the proxy thread's alone, and the load average the setting ran
  under (other jobs on a shared machine show up there).
* the proxy's own CPU per call at turn 1 and turn N of one long conversation, beside what a
  full re-render and re-tokenization would cost at turn N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

QUESTION = (
    "Please look at the next part of the repository and tell me what you find there, briefly. "
)

#: name -> one Ray call per generate (True) or the replica's chunked stream collected
VARIANTS = {"before": False, "after": True}
HOPS = (
    "client_to_proxy",
    "parse",
    "lock_wait",
    "prepare",
    "engine",
    "record_and_write",
    "proxy_to_client",
)


def collect_stream(replica) -> None:
    """The ``before`` variant: this replica's ``generate`` collects its chunked stream (several
    Ray objects per call), as it did before ``generate`` became one actor call."""
    from slr.contracts.engine import collect

    async def generate(prompt_ids, sampling, *, session_id=None):
        return await collect(replica.stream(prompt_ids, sampling, session_id=session_id))

    replica.generate = generate


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


# -- client process ---------------------------------------------------------------------------


async def _client(spec):
    import openai

    # Warm the SDK once (its first call imports and builds what later calls reuse) so that
    # no session's first timed call waits for that; every session's connection is opened
    # by an untimed GET /v1/models before its conversation starts.
    warm = openai.AsyncOpenAI(base_url=spec["warmup"], api_key="k", max_retries=0)
    await warm.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": QUESTION}], max_tokens=1
    )
    await warm.close()

    async def converse(url):
        c = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
        await c.models.list()
        messages, stamps = [], []
        for i in range(spec["calls"]):
            messages.append({"role": "user", "content": f"{QUESTION}({i})"})
            t = time.perf_counter()
            r = await c.chat.completions.create(
                model="policy", messages=messages, max_tokens=spec["max_tokens"]
            )
            stamps.append((t, time.perf_counter()))
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        floor = []
        for _ in range(spec["calls"]):
            t = time.perf_counter()
            await c.models.list()
            floor.append(time.perf_counter() - t)
        await c.close()
        return stamps, floor

    return await asyncio.gather(*(converse(u) for u in spec["urls"]))


# -- bench process ----------------------------------------------------------------------------


class TimedEngine:
    """The engine the proxy calls: stamps each call's submit and last token, per session.
    ``target`` is the engine under test (swapped between variants)."""

    def __init__(self, target):
        self.target = target
        self.stamps: dict[str, list[tuple[float, float]]] = {}

    tokenizer = property(lambda self: self.target.tokenizer)
    max_context = property(lambda self: self.target.max_context)
    weights_version = property(lambda self: self.target.weights_version)

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        t = time.perf_counter()
        gen = await self.target.generate(prompt_ids, sampling, session_id=session_id)
        self.stamps.setdefault(session_id, []).append((t, time.perf_counter()))
        return gen

    def stream(self, prompt_ids, sampling, *, session_id=None):
        return self.target.stream(prompt_ids, sampling, session_id=session_id)


class Stamped:
    """ASGI middleware: when each chat call reached the app (its request line and headers
    parsed) and when its last body byte was handed to the server, per session token."""

    def __init__(self, app):
        self.app = app
        self.calls: dict[str, list[tuple[float, float]]] = {}

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        arrived = time.perf_counter()
        token = path.split("/")[2]

        async def stamped_send(message):
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.calls.setdefault(token, []).append((arrived, time.perf_counter()))

        return await self.app(scope, receive, stamped_send)


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


def hops_of(client, asgi, engine, timing) -> dict[str, float]:
    """One call's hops in ms, from its stamps in the three processes."""
    (sent, received), (arrived, written), (submitted, returned) = client, asgi, engine
    lock, prepare = timing["lock_wait"], timing["prepare"]
    ms = {
        "client_to_proxy": 1000 * (arrived - sent),
        "lock_wait": lock,
        "prepare": prepare,
        "engine": 1000 * (returned - submitted),
        "record_and_write": 1000 * (written - returned),
        "proxy_to_client": 1000 * (received - written),
    }
    ms["parse"] = 1000 * (submitted - arrived) - lock - prepare
    return ms


def run_setting(args, pt, timed, stamped, engine, tok, sampling, label, n):
    """One setting: ``n`` sessions through the proxy, then the same straight to the engine."""
    p = pt.proxy
    timed.target = engine
    timed.stamps.clear()
    stamped.calls.clear()
    sessions = [p.open_session(f"bench-{label}-{n}-{i}") for i in range(n)]
    warmup = p.open_session(f"bench-{label}-{n}-warmup")
    spec = {
        "warmup": warmup.openai_base_url,
        "urls": [s.openai_base_url for s in sessions],
        "calls": args.calls,
        "max_tokens": args.max_tokens,
    }
    load_before = os.getloadavg()[0]
    thread_before, process_before = pt.call(_cpu())
    out = subprocess.run(
        [sys.executable, __file__, "--client", json.dumps(spec)],
        check=True,
        capture_output=True,
        text=True,
    )
    thread_after, process_after = pt.call(_cpu())
    load_after = os.getloadavg()[0]
    results = json.loads(out.stdout)
    floor = [x for _, f in results for x in f]
    added, server_added, e2e, eng = [], [], [], []
    hops: dict[str, list[float]] = {h: [] for h in HOPS}
    for s, (client_stamps, _) in zip(sessions, results, strict=True):
        turns = p.transcript(s)["calls"]
        rows = zip(
            client_stamps,
            stamped.calls[s.token],
            timed.stamps[s.engine_id],
            [t["timing_ms"] for t in turns],
            strict=True,
        )
        for client, asgi, engine_stamps, timing in rows:
            total = client[1] - client[0]
            in_engine = engine_stamps[1] - engine_stamps[0]
            added.append(total - in_engine)
            server_added.append((asgi[1] - asgi[0]) - in_engine)
            e2e.append(total)
            eng.append(in_engine)
            for hop, value in hops_of(client, asgi, engine_stamps, timing).items():
                hops[hop].append(value)
        p.close_session(s)
    p.close_session(warmup)
    text = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    prompts = [tok.encode(text, add_special_tokens=False) for _ in range(n)]

    async def direct():
        async def one(ids, sid):
            out = []
            for _ in range(args.calls):
                t = time.perf_counter()
                await engine.generate(ids, sampling, session_id=sid)
                out.append(time.perf_counter() - t)
            return out

        return await asyncio.gather(*(one(ids, f"d{i}") for i, ids in enumerate(prompts)))

    direct_lat = [x for row in pt.call(direct()) for x in row]
    calls = len(added)
    requests = calls + len(floor) + 1 + n  # and the warm-up: one call, one GET per session
    return {
        "calls": calls,
        "added_ms_p50": round(1000 * pct(added, 50), 2),
        "added_ms_p99": round(1000 * pct(added, 99), 2),
        "server_added_ms_p50": round(1000 * pct(server_added, 50), 2),
        "server_added_ms_p99": round(1000 * pct(server_added, 99), 2),
        "http_floor_ms_p50": round(1000 * pct(floor, 50), 2),
        "proxy_thread_cpu_ms_per_request": round(
            1000 * (thread_after - thread_before) / requests, 2
        ),
        "proxy_process_cpu_ms_per_request": round(
            1000 * (process_after - process_before) / requests, 2
        ),
        "proxy_e2e_ms_p50": round(1000 * pct(e2e, 50), 1),
        "proxy_e2e_ms_p99": round(1000 * pct(e2e, 99), 1),
        "engine_in_proxy_ms_p50": round(1000 * pct(eng, 50), 1),
        "direct_engine_ms_p50": round(1000 * pct(direct_lat, 50), 1),
        "direct_engine_ms_p99": round(1000 * pct(direct_lat, 99), 1),
        "load_average": round((load_before + load_after) / 2, 2),
        **{f"hop_{h}_ms_p50": round(pct(v, 50), 2) for h, v in hops.items()},
        **{f"hop_{h}_ms_p99": round(pct(v, 99), 2) for h, v in hops.items()},
    }


async def _cpu():
    return time.thread_time(), time.process_time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["ray", "embedded"], default="ray")
    ap.add_argument(
        "--repeat", "--runs", dest="repeat", type=int, default=3, help="runs of each setting"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--calls", type=int, default=8, help="calls per session")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        default=["before", "after"],
        help="ray: the settings compared side by side (see the module's docstring)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for this process (GIL hand-over between the proxy's loop "
        "and the engine's or Ray's threads; Python's default is 0.005 s)",
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

    from slr import log

    log.configure(stream=sys.stderr)  # stdout holds the report (one JSON object with --json)
    from slr_engine_hf.tiny import save, tiny_model

    from slr.config import ProxySection
    from slr.contracts import SamplingParams
    from slr.proxy import Proxy, ProxyThread
    from slr.proxy.messages import Message

    torch.set_num_threads(1)
    model, tok = tiny_model(max_context=8192)
    folder = save(model, tok, tempfile.mkdtemp(prefix="slr-bench-") + "/model")
    variants = args.variants if args.engine == "ray" else ["embedded"]
    engines = {}
    for name in variants:
        engines[name] = start_engine(args.engine, model, tok, folder)
        if not VARIANTS[name]:
            for _, replica in getattr(engines[name], "replicas", []):
                collect_stream(replica)
    timed = TimedEngine(engines[variants[0]])
    sampling = SamplingParams(max_tokens=args.max_tokens, stop_token_ids=())
    proxy = Proxy(timed, ProxySection(), sampling=SamplingParams(max_tokens=args.max_tokens))
    stamped = Stamped(proxy.app)
    proxy.app = stamped  # type: ignore[assignment]
    report: dict = {
        "engine": args.engine,
        "repeat": args.repeat,
        "cores": os.cpu_count(),
        "max_tokens": args.max_tokens,
        "calls_per_session": args.calls,
        "nice": {name: _nice(engines[name]) for name in variants},
    }
    per_run: dict[str, list[dict]] = {}
    pt = ProxyThread(proxy)
    with pt as p:
        for run in range(args.repeat):
            for n in args.concurrency:
                for name in variants:
                    row = run_setting(
                        args, pt, timed, stamped, engines[name], tok, sampling, run, n
                    )
                    per_run.setdefault(f"{n} sessions, {name}", []).append(row)
        for key, runs in per_run.items():
            report[key] = {
                name: {
                    "median": statistics.median(r[name] for r in runs),
                    "min": min(r[name] for r in runs),
                    "max": max(r[name] for r in runs),
                }
                for name in runs[0]
            }
        report["long conversation"] = long_conversation(args, pt, p, timed, engines, variants)
        full = report["long conversation"].pop("_history")
        history = [Message(role=m["role"], content=m["content"] or "") for m in full]
        t = time.process_time()
        for _ in range(5):
            proxy.renderer.encode(proxy.renderer.render(history, [], generation_prompt=True))
        key = f"turn_{args.turns}"
        report["long conversation"][key]["full_rerender_and_tokenize_ms"] = round(
            1000 * (time.process_time() - t) / 5, 2
        )
    for engine in engines.values():
        asyncio.run(engine.close())
    if not args.json:
        print_table(report, per_run)
    print(json.dumps(report, indent=None if args.json else 2))


def _nice(engine) -> int | None:
    replicas = getattr(engine, "replicas", None)
    if not replicas:
        return None
    return replicas[0][1].info.get("nice")


def long_conversation(args, pt, p, timed, engines, variants) -> dict:
    """The proxy thread's CPU per call over one long conversation (the last variant)."""
    import openai

    async def cpu():
        return time.thread_time()

    timed.target = engines[variants[-1]]
    s = p.open_session("bench-long")
    c = openai.OpenAI(base_url=s.openai_base_url, api_key="k", max_retries=0)
    messages, cpu_ms, prompt_tokens = [], [], []
    for i in range(args.turns):
        messages.append({"role": "user", "content": f"{QUESTION}({i})"})
        before = pt.call(cpu())
        r = c.chat.completions.create(model="policy", messages=messages, max_tokens=args.max_tokens)
        after = pt.call(cpu())
        cpu_ms.append(1000 * (after - before))
        prompt_tokens.append(r.usage.prompt_tokens)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    traj = p.close_session(s)
    return {
        "segments": len(traj.segments),
        "turn_1": {"prompt_tokens": prompt_tokens[0], "proxy_cpu_ms": round(cpu_ms[0], 2)},
        "turns_2_6_median_cpu_ms": round(statistics.median(cpu_ms[1:6]), 2),
        f"turns_{args.turns - 4}_{args.turns}_median_cpu_ms": round(
            statistics.median(cpu_ms[-5:]), 2
        ),
        f"turn_{args.turns}": {
            "prompt_tokens": prompt_tokens[-1],
            "proxy_cpu_ms": round(cpu_ms[-1], 2),
        },
        "_history": messages,
    }


def print_table(report: dict, per_run: dict[str, list[dict]]) -> None:
    print(
        f"engine: {report['engine']}; {report['repeat']} runs of each setting, interleaved "
        f"(median, min-max over runs); {report['cores']} cores; replica nice {report['nice']}"
    )

    def cell(row, name):
        return f"{row[name]['median']:g} ({row[name]['min']:g}-{row[name]['max']:g})"

    print(
        "\n| sessions | variant | added p50 ms | added p99 ms | in-proxy added p50 / p99 ms "
        "| direct engine p50 / p99 ms | proxy process CPU ms/req | load avg |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in per_run:
        row = report[key]
        sessions, variant = key.split(" sessions, ")
        print(
            f"| {sessions} | {variant} | {cell(row, 'added_ms_p50')} | "
            f"{cell(row, 'added_ms_p99')} | {row['server_added_ms_p50']['median']:g} / "
            f"{row['server_added_ms_p99']['median']:g} | "
            f"{row['direct_engine_ms_p50']['median']:g} / "
            f"{row['direct_engine_ms_p99']['median']:g} | "
            f"{cell(row, 'proxy_process_cpu_ms_per_request')} | {cell(row, 'load_average')} |"
        )
    print("\nwhere a call's time goes, ms, p50 / p99 over calls (median over runs)")
    print("| sessions | variant | " + " | ".join(HOPS) + " |")
    print("| ---: | --- |" + " ---: |" * len(HOPS))
    for key in per_run:
        row = report[key]
        sessions, variant = key.split(" sessions, ")
        cells = [
            f"{row[f'hop_{h}_ms_p50']['median']:g} / {row[f'hop_{h}_ms_p99']['median']:g}"
            for h in HOPS
        ]
        print(f"| {sessions} | {variant} | " + " | ".join(cells) + " |")
    print()


if __name__ == "__main__":
    main()
