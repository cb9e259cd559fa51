"""Sandbox backends at scale: docker exec latency and k8s API traffic, before vs after.

    .venv/bin/python bench/scale_sandboxes.py --n 8 --n 32 --n 128 --skip-k8s  # the issue's sizes
    .venv/bin/python bench/scale_sandboxes.py --n 8 --n 32 --pods 16 --json  # a 2-core machine
    .venv/bin/python bench/scale_sandboxes.py --skip-k8s                   # docker only

Bounded and loopback only: the docker daemon on this machine, and the cluster in KUBECONFIG
(``eval "$(scripts/k8s-up)"``: the local single-node Kubernetes on 127.0.0.1); every
sandbox and pod it starts is stopped before it exits.

1. docker: ``N`` trials of the trivial ``hello-world`` task at once (``--n``, each size in
   turn), all ``N`` sandboxes up before any command; each command's latency is recorded.
   Each size runs in a fresh process, first on the code of ``--before REF`` (a git commit,
   extracted to a temporary folder and imported instead of this checkout's core and docker
   backend), then on this code, ``--rounds`` times: before and after side by side, under
   the same machine load. Each row has the CPU per command (this process; the sandboxes'
   cgroups), the host's threads, the load average and how busy the machine's CPUs were, and
   where this code's commands spent their time (``ExecTrace``: to server, spawn, command,
   result sent, to host; p50/p99). ``--daemon`` also runs every load through the daemon's
   exec API on the same sandboxes. Two loads:
   * ``paced``: each trial runs ``--execs`` commands (``true``) ``--think-s`` apart (an
     agent waiting on its model between commands; first one at a random offset), the
     load a run puts on the backend. The p99 at the largest ``N`` over the p99 at the
     smallest is the issue's figure (goal: <= 2).
   * ``back-to-back``: the same commands with no pause, which measures the path's
     throughput (commands per second): with no pause every command waits for the N - 1
     ahead of it, so latency grows with N on any path once the CPUs are busy.
2. k8s: ``--pods`` pods started at once; every request the kubernetes client sends while
   they start is counted (create, reads, list, watch, log reads). Before: each start read
   its pod every 0.2 s until it ran (the watch left unstarted with a 0.2 s fallback is that
   loop exactly); after: one list-and-watch over the backend's pods.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import time
from pathlib import Path

import harness

from slr.plugins import get_plugin_manager
from slr.rollout.trial import new_trial_id
from slr.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[1]


def _task():
    return next(t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-world")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- docker ----------------------------------------------------------------------------

#: The commit whose exec path ``--before`` runs beside this one's by default: main before
#: the exec trace (and before the one-loop design that was measured slower and not kept).
BEFORE_REF = "4955d57"
EXEC_TIMEOUT_S = 120.0  # a command lost on the way fails the level instead of stalling it
SEGMENTS = (
    ("to server", "sent", "server_read"),
    ("spawn", "server_read", "started"),
    ("command", "started", "exited"),
    ("result sent", "exited", "server_sent"),
    ("to host", "server_sent", "read"),
)


def _cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of this machine's CPUs so far (/proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


async def _docker_level(n: int, execs: int, think_s: float, seed: int, daemon: bool) -> list[dict]:
    """One size on the code this process imports: ``n`` sandboxes, then each load."""
    import threading

    from slr_backend_docker.backend import DockerBackend

    backend = DockerBackend(sandboxes=n)
    task = _task()
    await backend.prepare(task)
    sandboxes = []
    rows = []
    try:
        t0 = time.perf_counter()
        starts = [
            backend.start(task, trial_id=new_trial_id("scale"), labels={"slr.bench": "scale"})
            for _ in range(n)
        ]
        results = await asyncio.gather(*starts, return_exceptions=True)
        sandboxes = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise RuntimeError(f"{len(failed)} of {n} sandboxes did not start: {failed[0]!r}")
        start_s = time.perf_counter() - t0
        if any(sb.channel is None for sb in sandboxes):
            raise RuntimeError("a sandbox started without its exec server")
        channels = [sb.channel for sb in sandboxes]
        traces: list = []
        for channel in channels:
            _record_traces(channel, traces)
        threads = threading.active_count()
        paths = ["daemon", "exec server"] if daemon else ["exec server"]
        for load in ("paced", "back-to-back"):
            for path in paths:
                for sb, channel in zip(sandboxes, channels, strict=True):
                    sb.channel = channel if path == "exec server" else None
                rng = random.Random(seed)
                offsets = [rng.uniform(0, think_s) for _ in sandboxes]
                pause = think_s if load == "paced" else 0.0

                async def trial(sb, offset: float, pause: float = pause) -> list[float]:
                    out = []
                    if pause:
                        await asyncio.sleep(offset)
                    for _ in range(execs):
                        t = time.perf_counter()
                        res = await sb.exec("true", timeout_s=EXEC_TIMEOUT_S)
                        out.append(time.perf_counter() - t)
                        if not res.ok:
                            raise RuntimeError(f"a command failed or was lost: {res}")
                        if pause:
                            await asyncio.sleep(pause)
                    return out

                del traces[:]
                load_avg = os.getloadavg()[0]
                busy0, total0 = _cpu_busy()
                sandbox_cpu0 = sum(sb.cpu_s() or 0.0 for sb in sandboxes)
                host_cpu0 = time.process_time()
                t0 = time.perf_counter()
                latencies = [
                    x for xs in await asyncio.gather(*map(trial, sandboxes, offsets)) for x in xs
                ]
                wall = time.perf_counter() - t0
                host_cpu = time.process_time() - host_cpu0
                sandbox_cpu = sum(sb.cpu_s() or 0.0 for sb in sandboxes) - sandbox_cpu0
                busy1, total1 = _cpu_busy()
                k = len(latencies)
                row = {
                    "trials": n,
                    "load": load,
                    "path": path,
                    "execs": k,
                    "start_all_s": round(start_s, 2),
                    "exec_p50_ms": round(1000 * statistics.median(latencies), 1),
                    "exec_p99_ms": round(1000 * _p(latencies, 0.99), 1),
                    "execs_per_s": round(k / wall, 1),
                    "host_cpu_ms_per_exec": round(1000 * host_cpu / k, 2),
                    "sandbox_cpu_ms_per_exec": round(1000 * sandbox_cpu / k, 2),
                    "host_threads": threads,
                    "load_avg": round(load_avg, 1),
                    "machine_busy_pct": round(100 * (busy1 - busy0) / max(total1 - total0, 1), 1),
                }
                if path == "exec server" and traces and None not in traces:
                    for name, a, b in SEGMENTS:
                        d = [1000 * (getattr(t, b) - getattr(t, a)) for t in traces]
                        row[f"{name} p50/p99 ms"] = f"{statistics.median(d):.1f}/{_p(d, 0.99):.1f}"
                rows.append(row)
    finally:
        await asyncio.gather(*(sb.stop() for sb in sandboxes), return_exceptions=True)
        await backend.close()
    return rows


def _record_traces(channel, traces: list) -> None:
    """Keep each command's ``ExecTrace`` (None where the channel has none: the code before)."""
    run = channel.run

    async def traced(*args, **kwargs):
        out = await run(*args, **kwargs)
        traces.append(getattr(out, "trace", None))
        return out

    channel.run = traced


def _tree(ref: str, into: Path) -> Path:
    """The core and the docker backend as they were at ``ref`` (git), to import instead."""
    import subprocess

    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "core/src", "sandbox_backends/docker/src"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"--before {ref}: git could not read that commit ({archive.stderr.decode().strip()}); "
            f"run from a clone that has it, or pass --before ''"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _level_in_subprocess(n: int, args, tree: Path | None) -> list[dict]:
    """One size in a fresh process (on ``tree``'s code when given): the two sides of a
    before/after pair never share a process, a thread pool or an event loop."""
    import subprocess
    import sys

    env = dict(os.environ)
    if tree is not None:
        paths = [str(tree / "core" / "src"), str(tree / "sandbox_backends" / "docker" / "src")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    argv = [sys.executable, __file__, "--level", str(n), "--execs", str(args.execs)]
    argv += ["--think-s", str(args.think_s), "--seed", str(args.seed)]
    argv += ["--daemon"] if args.daemon else []
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"level {n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def docker_bench(sizes: list[int], args) -> dict:
    """Each size, ``--rounds`` times, the code before (``--before``) then this code."""
    import tempfile

    levels = []
    with tempfile.TemporaryDirectory(prefix="slr-bench-before-") as tmp:
        before = _tree(args.before, Path(tmp)) if args.before else None
        for n in sizes:
            for round_ in range(args.rounds):
                sides = [("before", before), ("after", None)] if before else [("after", None)]
                for side, tree in sides:
                    for row in _level_in_subprocess(n, args, tree):
                        levels.append({"code": side, "round": round_, **row})
    return {"levels": levels, "p99_ratio_largest_vs_smallest": _ratios(levels, sizes)}


def _ratios(levels: list[dict], sizes: list[int]) -> dict:
    """p99 at the largest size over p99 at the smallest, per code, load and path (the
    median over rounds of each size's p99)."""
    small, big = min(sizes), max(sizes)
    ratios = {}
    for code in dict.fromkeys(r["code"] for r in levels):
        for load in ("paced", "back-to-back"):
            for path in dict.fromkeys(r["path"] for r in levels):

                def p99(n: int, code: str = code, load: str = load, path: str = path) -> float:
                    return statistics.median(
                        r["exec_p99_ms"]
                        for r in levels
                        if (r["code"], r["trials"], r["load"], r["path"]) == (code, n, load, path)
                    )

                ratios[f"{code}: {load} {path}"] = round(p99(big) / p99(small), 2)
    return ratios


# -- k8s -------------------------------------------------------------------------------


@contextlib.contextmanager
def _count_requests():
    """Count every HTTP request the kubernetes client sends (one per API call)."""
    from kubernetes.client import rest

    counts = {"n": 0}
    original = rest.RESTClientObject.request

    def counted(self, *args, **kwargs):
        counts["n"] += 1
        return original(self, *args, **kwargs)

    rest.RESTClientObject.request = counted
    try:
        yield counts
    finally:
        rest.RESTClientObject.request = original


async def _k8s_level(pods: int, mode: str) -> dict:
    from slr_backend_k8s import K8sBackendConfig
    from slr_backend_k8s.backend import K8sBackend

    config = K8sBackendConfig(
        containerd_address=os.environ.get("SLR_K8S_CONTAINERD", ""),
        request_ratio=0.01,
        max_concurrent_pods=pods,
        watch_fallback_s=0.2 if mode == "poll" else 2.0,
    )
    backend = K8sBackend(config)
    if mode == "poll":
        backend.watch.start = lambda: None  # no watch: every wait reads the pod after 0.2 s
    task = _task()
    await backend.prepare(task)
    sandboxes = []
    try:
        with _count_requests() as counts:
            t0 = time.perf_counter()
            results = await asyncio.gather(
                *(
                    backend.start(task, trial_id=new_trial_id("scale"), labels={"slr.bench": "1"})
                    for _ in range(pods)
                ),
                return_exceptions=True,
            )
            start_s = time.perf_counter() - t0
            requests = counts["n"]
        sandboxes = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise RuntimeError(f"{len(failed)} of {pods} pods did not start: {failed[0]!r}")
    finally:
        await asyncio.gather(*(sb.stop() for sb in sandboxes), return_exceptions=True)
        await backend.close()
    return {
        "pods": pods,
        "mode": "poll every 0.2 s (before)" if mode == "poll" else "watch (after)",
        "start_all_s": round(start_s, 2),
        "api_requests": requests,
        "requests_per_s": round(requests / start_s, 1),
        "requests_per_pod": round(requests / pods, 1),
    }


async def k8s_bench(pods: int) -> dict:
    # interleaved order would not help here: each level is one burst; watch first, then poll
    after = await _k8s_level(pods, "watch")
    before = await _k8s_level(pods, "poll")
    return {
        "levels": [before, after],
        "request_rate_before_over_after": round(
            before["requests_per_s"] / max(after["requests_per_s"], 1e-9), 1
        ),
    }


def _table(rows: list[dict], out: harness.Output) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out.table(keys, [[r.get(k) for k in keys] for r in rows])


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument(
        "--n", type=int, action="append", help="concurrent docker trials (repeat: 8 and 128)"
    )
    ap.add_argument("--execs", type=int, default=5, help="commands per trial, per load")
    ap.add_argument(
        "--think-s", type=float, default=2.0, help="paced load: seconds between a trial's commands"
    )
    ap.add_argument("--seed", type=int, default=0, help="the paced load's start offsets")
    ap.add_argument("--pods", type=int, default=64, help="k8s pods started at once")
    ap.add_argument(
        "--before",
        default=BEFORE_REF,
        metavar="REF",
        help="git commit whose exec path runs beside this one's, each size in turn "
        "(default: the one before the one-loop exec server); '' for this code only",
    )
    ap.add_argument("--rounds", type=int, default=1, help="before/after pairs per size")
    ap.add_argument(
        "--daemon", action="store_true", help="also run each load through the daemon's exec API"
    )
    ap.add_argument("--level", type=int, help=argparse.SUPPRESS)  # one size, this process
    ap.add_argument("--skip-docker", action="store_true")
    ap.add_argument("--skip-k8s", action="store_true")
    args = ap.parse_args()
    out = harness.Output(args)
    sizes = sorted(set(args.n or [8, 128]))
    if min(sizes) < 1 or args.pods < 1 or args.execs < 1 or args.rounds < 1:
        ap.error("--n, --pods, --execs and --rounds must be >= 1")
    get_plugin_manager()  # load the plugins (and their structlog routing) before timing
    if args.level is not None:
        level = _docker_level(args.level, args.execs, args.think_s, args.seed, args.daemon)
        print(json.dumps(asyncio.run(level)))  # to the parent, which reads the last line
        return
    report: dict = {"sizes": {}}
    if not args.skip_docker:
        report["sizes"].update(docker_trials=sizes, execs=args.execs, think_s=args.think_s)
        report["docker"] = docker_bench(sizes, args)
    if not args.skip_k8s:
        if not os.environ.get("KUBECONFIG"):
            ap.error('no KUBECONFIG: eval "$(scripts/k8s-up)" first, or pass --skip-k8s')
        report["sizes"]["pods"] = args.pods
        report["k8s"] = asyncio.run(k8s_bench(args.pods))
    if "docker" in report:
        _table(report["docker"]["levels"], out)
        out.print("p99 at the largest N / p99 at the smallest (goal <= 2 for the paced load):")
        for name, ratio in report["docker"]["p99_ratio_largest_vs_smallest"].items():
            out.print(f"  {name}: {ratio}")
        out.print()
    if "k8s" in report:
        _table(report["k8s"]["levels"], out)
        out.print(
            f"API request rate, poll / watch: {report['k8s']['request_rate_before_over_after']}"
        )
    out.result(report)


if __name__ == "__main__":
    main()
