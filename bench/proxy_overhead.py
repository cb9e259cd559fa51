"""What the proxy adds to a model call: latency, where it goes, and the proxy's own CPU.

    python bench/proxy_overhead.py [--engine ray|embedded] [--repeat 3] [--concurrency 1 8 32]
                                   [--variants h11 after] [--calls 8] [--turns 50]
                                   [--proxies 1] [--client-procs 1] [--json]

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
* where each call's time went, hop by hop (p50 / p99 over calls): the SDK's request (the
  openai SDK builds the request, up to handing it to its connection: an httpx event hook),
  client to proxy (the bytes reach the proxy, its loop takes the request), parse (body,
  routing, decoding), the session's lock, prepare (chat template, tokenization, prefix
  reuse), the engine (submit to last token), record and write (the reply built, recorded,
  sent), proxy to client (until the reply's head is in the client), and the SDK's reply
  (it reads and parses the reply). Stamps are ``time.perf_counter`` in each
  process (the system's monotonic clock, shared by processes on Linux).
* variants side by side in one run (``--variants``): ``after`` (today's proxy: one actor
  call per ``generate``, the httptools HTTP parser), ``h11`` (the same with h11, the
  pure-Python parser: ``[proxy] http_parser = "h11"``), and with ``--engine ray``
  ``before`` (``generate`` collects the replica's chunked stream: several Ray objects per
  call, each reported, acknowledged and awaited on the proxy's loop; a replica of its own).
  Each parser is a proxy of its own in the same process. The replicas' CPU priority (nice)
  is reported.
* the proxy process's CPU per call (all its threads: the proxy's loop and, with Ray, the
  driver's own threads) and the proxy thread's alone, and the load average the setting ran
  under (other jobs on a shared machine show up there).
* the proxy's own CPU per call at turn 1 and turn N of one long conversation, beside what a
  full re-render and re-tokenization would cost at turn N.

Layout. ``--proxies K`` (with ``--engine ray``) deals the sessions over K proxies, each in a
process of its own (a Ray actor, as each rollout worker hosts its node-local proxy in its own
process), all calling the same engine replica; 1 (the default) is one proxy in the bench's
own process. ``--client-procs M`` spreads the sessions over M client processes (an agent is
a process of its own; one client process serving all sessions queues their replies behind
each other in the SDK). On a machine with fewer cores than proxies + clients + replica,
these processes share cores, and the added latency measures that sharing.
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
from typing import Any, cast

import harness

QUESTION = (
    "Please look at the next part of the repository and tell me what you find there, briefly. "
)

#: name -> (one Ray call per generate (True) or the replica's chunked stream collected, the
#: proxy's HTTP parser)
VARIANTS = {"before": (False, "auto"), "after": (True, "auto"), "h11": (True, "h11")}
HOPS = (
    "sdk_request",
    "client_to_proxy",
    "parse",
    "lock_wait",
    "prepare",
    "engine",
    "record_and_write",
    "proxy_to_client",
    "sdk_reply",
)


def collect_stream(engine) -> None:
    """The ``before`` variant: each replica's ``generate`` behind ``engine`` collects its
    chunked stream (several Ray objects per call), as it did before ``generate`` became one
    actor call."""
    from slr.contracts.engine import collect

    def collecting(replica):
        async def generate(prompt_ids, sampling, *, session_id=None):
            return await collect(replica.stream(prompt_ids, sampling, session_id=session_id))

        return generate

    for _, replica in getattr(engine, "replicas", []):
        replica.generate = collecting(replica)


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
        # The SDK's own client (its defaults) with hooks that stamp when a chat request is
        # handed to the connection and when its reply's head is in.
        wire: list[float] = []

        async def stamp(message):
            if message.url.path.endswith("/chat/completions"):
                wire.append(time.perf_counter())

        async def stamp_reply(response):
            await stamp(response.request)

        http = openai.DefaultAsyncHttpxClient(
            event_hooks={"request": [stamp], "response": [stamp_reply]}
        )
        c = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0, http_client=http)
        await c.models.list()
        messages, stamps = [], []
        for i in range(spec["calls"]):
            messages.append({"role": "user", "content": f"{QUESTION}({i})"})
            wire.clear()
            t = time.perf_counter()
            r = await c.chat.completions.create(
                model="policy", messages=messages, max_tokens=spec["max_tokens"]
            )
            stamps.append((t, *wire, time.perf_counter()))
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
        self.stamps.setdefault(session_id or "", []).append((t, time.perf_counter()))
        return gen

    def stream(self, prompt_ids, sampling, *, session_id=None):
        return self.target.stream(prompt_ids, sampling, session_id=session_id)


class Stamped:
    """ASGI middleware: when each chat call reached the app (its request line and headers
    parsed) and when its last body byte was handed to the server, per session token."""

    def __init__(self, app, calls: dict[str, list[tuple[float, float]]]):
        self.app = app
        self.calls = calls

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


def start_engine(kind: str, model, tok, folder, device: str = "cpu"):
    """The engine under test: the embedded one, or one Ray replica actor loading ``folder``
    on ``device``."""
    if kind == "embedded":
        from slr_engine_hf.engine import HfEngine

        return HfEngine.from_model(model, tok)
    from slr.cluster.engines import start_engine_replicas
    from slr.config import load_config
    from slr.plugins import get_plugin_manager

    data = {
        # A GPU for the replica when it decodes on one (Ray hides GPUs from actors that ask none).
        "run": {
            "engine_replicas": 1,
            "engine_resources": {"CPU": 1, **({"GPU": 1} if device != "cpu" else {})},
        },
        "engine": {"name": "hf", "model": str(folder), "threads": 1, "device": device},
    }
    config = load_config(data=data, plugins=get_plugin_manager(), only_plugins=("engine",))
    return start_engine_replicas(config)


def hops_of(client, asgi, engine, timing) -> dict[str, float]:
    """One call's hops in ms, from its stamps in the three processes. ``client``: the call
    began, its request was handed to the connection, its reply's head was in, it returned
    (the SDK's own work before and after the socket: ``sdk_request``, ``sdk_reply``)."""
    sent, on_wire, head_in, received = client
    (arrived, written), (submitted, returned) = asgi, engine
    lock, prepare = timing["lock_wait"], timing["prepare"]
    ms = {
        "sdk_request": 1000 * (on_wire - sent),
        "client_to_proxy": 1000 * (arrived - on_wire),
        "lock_wait": lock,
        "prepare": prepare,
        "engine": 1000 * (returned - submitted),
        "record_and_write": 1000 * (written - returned),
        "proxy_to_client": 1000 * (head_in - written),
        "sdk_reply": 1000 * (received - head_in),
    }
    ms["parse"] = 1000 * (submitted - arrived) - lock - prepare
    return ms


class ProxyHost:
    """One proxy under test with its stamps, on a loop thread of its own: in the bench's
    process, or (``--proxies`` > 1) as a Ray actor (``ray.remote(ProxyHost)``), the way a
    rollout worker hosts its node-local proxy; one proxy per HTTP parser the variants use.
    ``engines``: variant name -> the engine, or (in an actor) the replica handles to attach
    to."""

    def __init__(self, engines: dict, max_tokens: int, *, attach: bool = False) -> None:
        import torch

        from slr.config import ProxySection
        from slr.contracts import SamplingParams
        from slr.proxy import Proxy, ProxyThread

        torch.set_num_threads(1)
        if attach:
            from slr.cluster.engines import attach_replicas

            engines = {
                name: attach_replicas(h, probe_interval_s=None) for name, h in engines.items()
            }
            for name, engine in engines.items():
                if not VARIANTS[name][0]:
                    collect_stream(engine)
        self.engines = engines
        self.timed = TimedEngine(next(iter(engines.values())))
        self.calls: dict[str, list[tuple[float, float]]] = {}
        self.proxies: dict[str, Any] = {}
        for name in engines:
            parser = VARIANTS[name][1]
            if parser not in self.proxies:
                config = ProxySection(http_parser=cast(Any, parser))
                sampling = SamplingParams(max_tokens=max_tokens)
                proxy = Proxy(cast(Any, self.timed), config, sampling=sampling)
                proxy.app = Stamped(proxy.app, self.calls)  # type: ignore[assignment]
                self.proxies[parser] = proxy
        first, *others = self.proxies.values()
        self.pt = ProxyThread(first)
        self.pt.__enter__()
        for proxy in others:  # on the same loop
            self.pt.call(proxy.start())
        self.proxy = first
        self.sessions: dict[str, Any] = {}

    def open(self, variant: str, names: list[str]) -> tuple[str, list[str]]:
        """Sessions for the next setting, on ``variant``'s engine, and one to warm the
        clients up on: (the warm-up's OpenAI base URL, the sessions' ones)."""
        self.timed.target = self.engines[variant]
        self.timed.stamps.clear()
        self.calls.clear()
        self.proxy = self.proxies[VARIANTS[variant][1]]
        self.warmup = self.proxy.open_session(f"{names[0]}-warmup" if names else "warmup")
        self.sessions = {n: self.proxy.open_session(n) for n in names}
        return self.warmup.openai_base_url, [s.openai_base_url for s in self.sessions.values()]

    def cpu(self) -> tuple[float, float]:
        """(the proxy loop thread's CPU, this process's CPU), seconds."""
        return self.pt.call(_cpu())

    def measure(self, stamps: dict[str, list]) -> dict[str, list[float]]:
        """Every call of this setting's sessions, from the clients' stamps (session name ->
        [(sent, received)]) and the proxy's; the sessions are closed."""
        out: dict[str, list[float]] = {
            k: [] for k in ("added", "server_added", "e2e", "in_engine", *HOPS)
        }
        for name, s in self.sessions.items():
            turns = self.proxy.transcript(s)["calls"]
            rows = zip(
                stamps[name],
                self.calls[s.token],
                self.timed.stamps[s.engine_id],
                [t["timing_ms"] for t in turns],
                strict=True,
            )
            for client, asgi, engine_stamps, timing in rows:
                total = client[-1] - client[0]
                in_engine = engine_stamps[1] - engine_stamps[0]
                out["added"].append(total - in_engine)
                out["server_added"].append((asgi[1] - asgi[0]) - in_engine)
                out["e2e"].append(total)
                out["in_engine"].append(in_engine)
                for hop, value in hops_of(client, asgi, engine_stamps, timing).items():
                    out[hop].append(value)
            self.proxy.close_session(s)
        self.proxy.close_session(self.warmup)
        self.sessions = {}
        return out

    def long_conversation(self, variant: str, turns: int, max_tokens: int) -> dict:
        """The proxy thread's CPU per call over one long conversation."""
        import openai

        from slr.proxy.messages import Message

        self.timed.target = self.engines[variant]
        self.proxy = self.proxies[VARIANTS[variant][1]]
        s = self.proxy.open_session("bench-long")
        c = openai.OpenAI(base_url=s.openai_base_url, api_key="k", max_retries=0)
        messages, cpu_ms, prompt_tokens = [], [], []
        for i in range(turns):
            messages.append({"role": "user", "content": f"{QUESTION}({i})"})
            before = self.pt.call(_cpu())[0]
            r = c.chat.completions.create(model="policy", messages=messages, max_tokens=max_tokens)
            after = self.pt.call(_cpu())[0]
            cpu_ms.append(1000 * (after - before))
            assert r.usage is not None
            prompt_tokens.append(r.usage.prompt_tokens)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        traj = self.proxy.close_session(s)
        history = [Message(role=m["role"], content=m["content"] or "") for m in messages]
        renderer = self.proxy.renderer
        t = time.process_time()
        for _ in range(5):
            renderer.encode(renderer.render(history, [], generation_prompt=True))
        rerender_ms = 1000 * (time.process_time() - t) / 5
        return {
            "segments": len(traj.segments),
            "turn_1": {"prompt_tokens": prompt_tokens[0], "proxy_cpu_ms": round(cpu_ms[0], 2)},
            "turns_2_6_median_cpu_ms": round(statistics.median(cpu_ms[1:6]), 2),
            f"turns_{turns - 4}_{turns}_median_cpu_ms": round(statistics.median(cpu_ms[-5:]), 2),
            f"turn_{turns}": {
                "prompt_tokens": prompt_tokens[-1],
                "proxy_cpu_ms": round(cpu_ms[-1], 2),
                "full_rerender_and_tokenize_ms": round(rerender_ms, 2),
            },
        }

    def close(self) -> None:
        for proxy in list(self.proxies.values())[1:]:
            self.pt.call(proxy.stop())
        self.pt.__exit__(None, None, None)


class Hosts:
    """The proxies of a run, called alike whether in this process or Ray actors."""

    def __init__(self, hosts: list, remote: bool) -> None:
        self.hosts, self.remote = hosts, remote

    def call(self, method: str, args_per_host: list[tuple]) -> list:
        if not self.remote:
            return [getattr(h, method)(*a) for h, a in zip(self.hosts, args_per_host, strict=True)]
        import ray

        refs = [
            getattr(h, method).remote(*a) for h, a in zip(self.hosts, args_per_host, strict=True)
        ]
        return ray.get(refs)

    def each(self, method: str, *args) -> list:
        return self.call(method, [args] * len(self.hosts))

    def first(self, method: str, *args):
        return Hosts(self.hosts[:1], self.remote).each(method, *args)[0]


def start_hosts(args, engines: dict) -> Hosts:
    """``--proxies`` proxies: one here, or that many Ray actors (one process each) attached
    to the engine replicas the bench started."""
    if args.proxies == 1:
        return Hosts([ProxyHost(engines, args.max_tokens)], remote=False)
    import ray

    from slr.cluster.engines import replica_handles

    handles = {name: replica_handles(e) for name, e in engines.items()}
    remote = ray.remote(num_cpus=0)(ProxyHost)
    # Ray actor handles: their methods are called through .remote, which no type describes
    hosts: list[Any] = [
        remote.options(max_concurrency=2).remote(handles, args.max_tokens, attach=True)  # type: ignore[attr-defined]
        for _ in range(args.proxies)
    ]
    ray.get([h.cpu.remote() for h in hosts])  # started
    return Hosts(hosts, remote=True)


def run_clients(specs: list[dict]) -> list:
    """Each spec's sessions in a client process of its own, all started at once; each
    process's result, in order."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--client", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec in specs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"a client process failed (exit {proc.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out))
    return results


def run_setting(args, hosts: Hosts, loop, engine, tok, sampling, variant, label, n):
    """One setting: ``n`` sessions through the proxies, then the same straight to the engine."""
    k = len(hosts.hosts)
    names = [[f"bench-{label}-{variant}-{n}-{i}" for i in range(n) if i % k == j] for j in range(k)]
    opened = hosts.call("open", [(variant, ns) for ns in names])
    warmup = [w for w, _ in opened]
    urls = [us for _, us in opened]
    by_url = {
        u: name for ns, us in zip(names, urls, strict=True) for name, u in zip(ns, us, strict=True)
    }
    everything = [u for us in urls for u in us]
    procs = max(1, min(args.client_procs, n))
    specs = [
        {
            "warmup": warmup[i % k],
            "urls": everything[i::procs],
            "calls": args.calls,
            "max_tokens": args.max_tokens,
        }
        for i in range(procs)
    ]
    load_before = os.getloadavg()[0]
    cpu_before = hosts.each("cpu")
    results = run_clients(specs)
    cpu_after = hosts.each("cpu")
    load_after = os.getloadavg()[0]
    stamps, floor = {}, []
    for spec, result in zip(specs, results, strict=True):
        for url, (client_stamps, f) in zip(spec["urls"], result, strict=True):
            stamps[by_url[url]] = client_stamps
            floor.extend(f)
    measured = hosts.each("measure", stamps)
    m = {key: [x for part in measured for x in part[key]] for key in measured[0]}
    thread_cpu = sum(a[0] - b[0] for a, b in zip(cpu_after, cpu_before, strict=True))
    process_cpu = sum(a[1] - b[1] for a, b in zip(cpu_after, cpu_before, strict=True))
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

    direct_lat = [
        x for row in asyncio.run_coroutine_threadsafe(direct(), loop).result() for x in row
    ]
    added, server_added = m["added"], m["server_added"]
    calls = len(added)
    requests = calls + len(floor) + procs + n  # and the warm-ups: one call per client process
    return {
        "calls": calls,
        "added_ms_p50": round(1000 * pct(added, 50), 2),
        "added_ms_p99": round(1000 * pct(added, 99), 2),
        "server_added_ms_p50": round(1000 * pct(server_added, 50), 2),
        "server_added_ms_p99": round(1000 * pct(server_added, 99), 2),
        "http_floor_ms_p50": round(1000 * pct(floor, 50), 2),
        "proxy_thread_cpu_ms_per_request": round(1000 * thread_cpu / requests, 2),
        "proxy_process_cpu_ms_per_request": round(1000 * process_cpu / requests, 2),
        "proxy_e2e_ms_p50": round(1000 * pct(m["e2e"], 50), 1),
        "proxy_e2e_ms_p99": round(1000 * pct(m["e2e"], 99), 1),
        "engine_in_proxy_ms_p50": round(1000 * pct(m["in_engine"], 50), 1),
        "direct_engine_ms_p50": round(1000 * pct(direct_lat, 50), 1),
        "direct_engine_ms_p99": round(1000 * pct(direct_lat, 99), 1),
        "load_average": round((load_before + load_after) / 2, 2),
        **{f"hop_{h}_ms_p50": round(pct(m[h], 50), 2) for h in HOPS},
        **{f"hop_{h}_ms_p99": round(pct(m[h], 99), 2) for h in HOPS},
    }


async def _cpu():
    return time.thread_time(), time.process_time()


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--engine", choices=["ray", "embedded"], default="ray")
    ap.add_argument(
        "--repeat", "--runs", dest="repeat", type=int, default=3, help="runs of each setting"
    )
    ap.add_argument("--calls", type=int, default=8, help="calls per session")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        default=["h11", "after"],
        help="the settings compared side by side (see the module's docstring)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for this process (GIL hand-over between the proxy's loop "
        "and the engine's or Ray's threads; Python's default is 0.005 s)",
    )
    ap.add_argument(
        "--proxies",
        type=int,
        default=1,
        help="proxies the sessions are dealt over, each a process of its own (--engine ray); "
        "1: one proxy in the bench's process",
    )
    ap.add_argument(
        "--client-procs", type=int, default=1, help="client processes the sessions are spread over"
    )
    ap.add_argument(
        "--tokenizer",
        help="a tokenizer folder (tokenizer.json and chat template) to use instead of the "
        "packaged SmolLM2's, on a machine without the model's package",
    )
    ap.add_argument(
        "--engine-device",
        default="cpu",
        help="torch device of the Ray replica ('cuda' on a machine with a GPU: faster steps, "
        "shorter runs; the proxy's side is the same)",
    )
    ap.add_argument("--client", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.client:
        print(json.dumps(asyncio.run(_client(json.loads(args.client)))))
        return
    if args.proxies < 1 or args.client_procs < 1:
        ap.error("--proxies and --client-procs take 1 or more")
    if args.engine_device != "cpu" and args.engine != "ray":
        ap.error("--engine-device needs --engine ray")
    if args.proxies > 1 and args.engine != "ray":
        ap.error("--proxies > 1 needs --engine ray (the proxies reach the replica through Ray)")
    # The report is the only thing on stdout: Ray's actors print their log lines on the
    # driver's stdout, so everything else goes to stderr and the report to the saved stdout.
    out = harness.Output(args, stdout=os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)

    import tempfile
    import threading

    import torch

    from slr import log

    log.configure(stream=sys.stderr)
    from slr.contracts import SamplingParams
    from slr_testkit.tiny import save, tiny_model

    torch.set_num_threads(1)
    if args.tokenizer:
        from transformers import AutoTokenizer

        model, tok = tiny_model(max_context=8192, tok=AutoTokenizer.from_pretrained(args.tokenizer))
    else:
        model, tok = tiny_model(max_context=8192)
    folder = save(model, tok, tempfile.mkdtemp(prefix="slr-bench-") + "/model")
    variants = args.variants
    if args.engine == "embedded" and "before" in variants:
        ap.error("the 'before' variant needs --engine ray (a replica's chunked stream)")
    engines, by_mode = {}, {}  # one engine per way of calling it, shared by the parsers
    for name in variants:
        one_call = VARIANTS[name][0]
        if one_call not in by_mode:
            by_mode[one_call] = start_engine(args.engine, model, tok, folder, args.engine_device)
            if not one_call:
                collect_stream(by_mode[one_call])
        engines[name] = by_mode[one_call]
    sampling = SamplingParams(max_tokens=args.max_tokens, stop_token_ids=())
    report: dict = {
        "engine": args.engine,
        "repeat": args.repeat,
        "cores": os.cpu_count(),
        "proxies": args.proxies,
        "client_procs": args.client_procs,
        "engine_device": args.engine_device,
        "max_tokens": args.max_tokens,
        "calls_per_session": args.calls,
        "nice": {name: _nice(engines[name]) for name in variants},
    }
    hosts = start_hosts(args, engines)
    if hosts.remote:  # the direct calls: from a loop of the bench's own
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    else:
        loop = hosts.hosts[0].pt.loop
    per_run: dict[str, list[dict]] = {}
    for run in range(args.repeat):
        for n in args.concurrency:
            for name in variants:
                row = run_setting(args, hosts, loop, engines[name], tok, sampling, name, run, n)
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
    report["long conversation"] = hosts.first(
        "long_conversation", variants[-1], args.turns, args.max_tokens
    )
    hosts.each("close")
    for engine in by_mode.values():
        asyncio.run(engine.close())
    print_table(report, per_run, out)
    out.result(report)


def _nice(engine) -> int | None:
    replicas = getattr(engine, "replicas", None)
    if not replicas:
        return None
    return replicas[0][1].info.get("nice")


def print_table(report: dict, per_run: dict[str, list[dict]], out: harness.Output) -> None:
    out.print(
        f"engine: {report['engine']}; {report['repeat']} runs of each setting, interleaved "
        f"(median, min-max over runs); {report['cores']} cores; replica nice {report['nice']}"
    )

    def cell(row, name):
        return f"{row[name]['median']:g} ({row[name]['min']:g}-{row[name]['max']:g})"

    def both(row, name):
        return f"{row[name + '_p50']['median']:g} / {row[name + '_p99']['median']:g}"

    settings = [(key, report[key], *key.split(" sessions, ")) for key in per_run]
    out.table(
        [
            ("sessions", ">"),
            "variant",
            ("added p50 ms", ">"),
            ("added p99 ms", ">"),
            ("in-proxy added p50 / p99 ms", ">"),
            ("direct engine p50 / p99 ms", ">"),
            ("proxy process CPU ms/req", ">"),
            ("load avg", ">"),
        ],
        [
            [
                sessions,
                variant,
                cell(row, "added_ms_p50"),
                cell(row, "added_ms_p99"),
                both(row, "server_added_ms"),
                both(row, "direct_engine_ms"),
                cell(row, "proxy_process_cpu_ms_per_request"),
                cell(row, "load_average"),
            ]
            for _, row, sessions, variant in settings
        ],
    )
    out.table(
        [("sessions", ">"), "variant", *((h, ">") for h in HOPS)],
        [
            [sessions, variant, *(both(row, f"hop_{h}_ms") for h in HOPS)]
            for _, row, sessions, variant in settings
        ],
        title="\nwhere a call's time goes, ms, p50 / p99 over calls (median over runs)",
    )


if __name__ == "__main__":
    main()
