"""Sandbox backends at scale: docker exec latency and k8s API traffic, before vs after.

    .venv/bin/python bench/scale_sandboxes.py --n 8 --n 128 --pods 64      # the issue's sizes
    .venv/bin/python bench/scale_sandboxes.py --n 8 --n 32 --pods 16 --json  # a 2-core machine
    .venv/bin/python bench/scale_sandboxes.py --skip-k8s                   # docker only

Bounded and loopback only: the docker daemon on this machine, and the cluster in KUBECONFIG
(``eval "$(scripts/k8s-up)"``: the local single-node Kubernetes on 127.0.0.1); every
sandbox and pod it starts is stopped before it exits.

1. docker: ``N`` trials of the trivial ``hello-world`` task at once (``--n``, each size in
   turn); every trial runs ``--execs`` commands (``true``) back to back once all ``N``
   sandboxes are up, and each exec's latency is recorded. The p99 at the largest ``N`` over
   the p99 at the smallest is the figure (goal: <= 2). At the largest ``N`` it is measured
   twice, side by side: with the backend's thread pool sized to the run (today) and with the
   fixed 64-thread pool it had before (``--n`` above 64 makes execs queue for a thread).
2. k8s: ``--pods`` pods started at once; every request the kubernetes client sends while
   they start is counted (create, reads, list, watch, log reads). Before: each start read
   its pod every 0.2 s until it ran (the watch left unstarted with a 0.2 s fallback is that
   loop exactly); after: one list-and-watch over the backend's pods.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

from slr.plugins import get_plugin_manager
from slr.tasks import load_tasks
from slr.trial import new_trial_id

ROOT = Path(__file__).resolve().parents[1]
OLD_DOCKER_THREADS = 64  # the docker backend's fixed pool before it was sized to the run


def _task():
    return next(t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-world")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- docker ----------------------------------------------------------------------------


async def _docker_level(n: int, execs: int, *, old_pool: bool) -> dict:
    from slr_backend_docker.backend import DockerBackend

    backend = DockerBackend(sandboxes=n)
    if old_pool:
        backend._pool.shutdown(wait=False)
        backend._pool = concurrent.futures.ThreadPoolExecutor(
            OLD_DOCKER_THREADS, thread_name_prefix="slr-docker-old"
        )
    task = _task()
    await backend.prepare(task)
    sandboxes = []
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

        async def trial(sb) -> list[float]:
            out = []
            for _ in range(execs):
                t = time.perf_counter()
                res = await sb.exec("true")
                out.append(time.perf_counter() - t)
                assert res.ok, res
            return out

        t0 = time.perf_counter()
        latencies = [x for xs in await asyncio.gather(*map(trial, sandboxes)) for x in xs]
        exec_s = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(sb.stop() for sb in sandboxes), return_exceptions=True)
        await backend.close()
    return {
        "trials": n,
        "threads": OLD_DOCKER_THREADS if old_pool else backend.threads,
        "pool": "fixed 64 (before)" if old_pool else "sized to the run",
        "execs": len(latencies),
        "start_all_s": round(start_s, 2),
        "exec_p50_ms": round(1000 * statistics.median(latencies), 1),
        "exec_p99_ms": round(1000 * _p(latencies, 0.99), 1),
        "execs_per_s": round(len(latencies) / exec_s, 1),
    }


async def docker_bench(sizes: list[int], execs: int) -> dict:
    levels = [await _docker_level(n, execs, old_pool=False) for n in sizes]
    big = max(sizes)
    if big > OLD_DOCKER_THREADS:
        levels.append(await _docker_level(big, execs, old_pool=True))
    small = next(lv for lv in levels if lv["trials"] == min(sizes))
    large = next(lv for lv in levels if lv["trials"] == big and lv["pool"] != "fixed 64 (before)")
    report: dict = {
        "levels": levels,
        "p99_ratio_largest_vs_smallest": round(large["exec_p99_ms"] / small["exec_p99_ms"], 2),
    }
    before = [lv for lv in levels if lv["pool"] == "fixed 64 (before)"]
    if before:
        report["p99_ratio_before"] = round(before[0]["exec_p99_ms"] / small["exec_p99_ms"], 2)
    return report


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


def _table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = [" | ".join(keys), " | ".join("---" for _ in keys)]
    lines += [" | ".join(str(r[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--n", type=int, action="append", help="concurrent docker trials (repeat: 8 and 128)"
    )
    ap.add_argument("--execs", type=int, default=20, help="execs per trial")
    ap.add_argument("--pods", type=int, default=64, help="k8s pods started at once")
    ap.add_argument("--skip-docker", action="store_true")
    ap.add_argument("--skip-k8s", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    sizes = sorted(set(args.n or [8, 128]))
    if min(sizes) < 1 or args.pods < 1 or args.execs < 1:
        ap.error("--n, --pods and --execs must be >= 1")
    get_plugin_manager()  # load the plugins (and their structlog routing) before timing
    report: dict = {"sizes": {}}
    if not args.skip_docker:
        report["sizes"].update(docker_trials=sizes, execs=args.execs)
        report["docker"] = asyncio.run(docker_bench(sizes, args.execs))
    if not args.skip_k8s:
        if not os.environ.get("KUBECONFIG"):
            ap.error('no KUBECONFIG: eval "$(scripts/k8s-up)" first, or pass --skip-k8s')
        report["sizes"]["pods"] = args.pods
        report["k8s"] = asyncio.run(k8s_bench(args.pods))
    if args.json:
        print(json.dumps(report))
        return
    if "docker" in report:
        print(_table(report["docker"]["levels"]))
        print(
            f"p99 at the largest N / p99 at the smallest: "
            f"{report['docker']['p99_ratio_largest_vs_smallest']} (goal <= 2)"
        )
        if "p99_ratio_before" in report["docker"]:
            print(f"... with the fixed 64-thread pool: {report['docker']['p99_ratio_before']}")
        print()
    if "k8s" in report:
        print(_table(report["k8s"]["levels"]))
        print(f"API request rate, poll / watch: {report['k8s']['request_rate_before_over_after']}")


if __name__ == "__main__":
    main()
