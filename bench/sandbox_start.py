"""Sandbox start latency and trial throughput, as ratios measured in one run.

    .venv/bin/python bench/sandbox_start.py               # docker (needs dockerd + base image)
    .venv/bin/python bench/sandbox_start.py --backend local --backend docker
    eval "$(scripts/k8s-up)"; .venv/bin/python bench/sandbox_start.py --backend k8s
    .venv/bin/python bench/sandbox_start.py --backend local --json  # one JSON object

1. start -> first exec with a cached image (``backend.start`` + ``exec("true")``), against a
   bare ``docker run --rm IMAGE true`` of the same image, interleaved, medians compared.
   The same from a warm sandbox pool (``[rollout] pool_size``: the sandbox was started
   ahead, so what is left is the hand-out and its health check), interleaved with the
   plain starts; ``pool_ratio`` is pool / plain.
2. trials per minute with the oracle agent on the bundled example tasks at 1, 4 and 8
   concurrent trials (verifier included, image builds excluded: prepared first).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from pathlib import Path

import harness

from slr.plugins import get_plugin_manager
from slr.rollout.trial import StandInSessions, new_trial_id, run_trial, run_trials
from slr.sandboxing.pool import SandboxPool
from slr.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[1]


def make_backend(name: str):
    registration = get_plugin_manager().get("sandbox_backend", name)
    if name == "k8s":
        from slr_backend_k8s import K8sBackendConfig

        # The cluster in KUBECONFIG (scripts/k8s-up). A small dev node: requests far below
        # limits, so 8 trials fit at once.
        return registration.create(
            K8sBackendConfig(
                containerd_address=os.environ.get("SLR_K8S_CONTAINERD", ""), request_ratio=0.05
            )
        )
    return registration.create()


async def start_latency(backend, task, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sb = await backend.start(task, trial_id=new_trial_id("bench"), labels={"slr.bench": "1"})
        try:
            res = await sb.exec("true")
            out.append(time.perf_counter() - t0)
            assert res.ok, res
        finally:
            await sb.stop()
    return out


async def pool_latency(backend, task, reps: int) -> list[float]:
    """start -> first exec with the sandbox taken from a warm pool of one."""
    pool = SandboxPool(backend, size=1)
    pool.expect([task] * reps)
    out = []
    try:
        for _ in range(reps):
            await pool.wait_ready()  # a warm sandbox is what the pool is for
            out += await start_latency(pool, task, 1)
    finally:
        await pool.drain()
    return out


def bare_docker_run(image: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--label", "slr.bench=1", image, "true"], check=True)
    return time.perf_counter() - t0


async def throughput(backend, tasks, concurrency: int, n: int) -> dict:
    oracle = get_plugin_manager().get("agent", "oracle").create()
    verifier = get_plugin_manager().get("verifier", "harbor").create()
    sessions = StandInSessions()
    picks = [tasks[i % len(tasks)] for i in range(n)]
    t0 = time.perf_counter()
    results = await run_trials(
        [
            lambda t=t: run_trial(
                t, backend=backend, agent=oracle, verifier=verifier, session_factory=sessions
            )
            for t in picks
        ],
        concurrency=concurrency,
    )
    elapsed = time.perf_counter() - t0
    ok = sum(1 for r in results if r.reward is not None and r.reward.value == 1.0)
    return {
        "concurrency": concurrency,
        "trials": n,
        "solved": ok,
        "seconds": round(elapsed, 2),
        "trials_per_min": round(n / elapsed * 60, 1),
        "median_trial_s": round(statistics.median(r.timings["total_s"] for r in results), 3),
    }


async def bench(name: str, reps: int, per_level: int) -> dict:
    backend = make_backend(name)
    tasks = load_tasks(ROOT / "examples" / "tasks")
    simple = next(t for t in tasks if t.id == "hello-world")
    for t in tasks:
        await backend.prepare(t)
    await start_latency(backend, simple, 1)  # warm-up
    report: dict = {"backend": name}
    if name == "docker":
        image = backend.image_tag(simple)
        bare_docker_run(image)
        starts, bares = [], []
        for _ in range(reps):  # interleaved, so load drift hits both alike
            bares.append(await asyncio.to_thread(bare_docker_run, image))
            starts += await start_latency(backend, simple, 1)
        report["bare_docker_run_s"] = round(statistics.median(bares), 3)
        report["start_to_first_exec_s"] = round(statistics.median(starts), 3)
        report["ratio_vs_bare_docker_run"] = round(
            statistics.median(starts) / statistics.median(bares), 2
        )
    else:
        report["start_to_first_exec_s"] = round(
            statistics.median(await start_latency(backend, simple, reps)), 3
        )
    plain, pooled = [], []
    for _ in range(reps):  # interleaved, so load drift hits both alike
        plain += await start_latency(backend, simple, 1)
        pooled += await pool_latency(backend, simple, 1)
    report["pool"] = {
        "start_to_first_exec_s": round(statistics.median(plain), 3),
        "pool_start_to_first_exec_s": round(statistics.median(pooled), 3),
        "pool_ratio": round(statistics.median(pooled) / statistics.median(plain), 3),
    }
    if per_level:
        report["throughput"] = [
            await throughput(backend, tasks, c, max(per_level, c * 2)) for c in (1, 4, 8)
        ]
    await backend.close()
    return report


def main() -> None:
    p = harness.parser(__doc__, whole_doc=True)
    p.add_argument("--backend", action="append", help="docker (default), local and/or k8s")
    p.add_argument("--reps", type=int, default=10, help="start-latency samples")
    p.add_argument(
        "--trials", type=int, default=8, help="trials per concurrency level (min 2x; 0: skip)"
    )
    args = p.parse_args()
    out = harness.Output(args)
    from slr import log

    log.configure(level="warning")
    reports = [asyncio.run(bench(b, args.reps, args.trials)) for b in args.backend or ["docker"]]
    out.table(
        [
            ("backend", "<"),
            ("start → exec s", ".3f"),
            ("bare docker run s", ".3f"),
            ("ratio", ".2f"),
            ("plain s", ".3f"),
            ("pool s", ".3f"),
            ("pool ratio", ".3f"),
        ],
        [
            [
                r["backend"],
                r["start_to_first_exec_s"],
                r.get("bare_docker_run_s"),
                r.get("ratio_vs_bare_docker_run"),
                r["pool"]["start_to_first_exec_s"],
                r["pool"]["pool_start_to_first_exec_s"],
                r["pool"]["pool_ratio"],
            ]
            for r in reports
        ],
        title="start to first exec, medians (interleaved)",
    )
    levels = [(r["backend"], t) for r in reports for t in r.get("throughput", [])]
    if levels:
        out.table(
            [
                ("backend", "<"),
                "concurrency",
                "trials",
                "solved",
                ("seconds", ".2f"),
                ("trials/min", ".1f"),
                ("median trial s", ".3f"),
            ],
            [
                [
                    b,
                    t["concurrency"],
                    t["trials"],
                    t["solved"],
                    t["seconds"],
                    t["trials_per_min"],
                    t["median_trial_s"],
                ]
                for b, t in levels
            ],
            title="\ntrials per minute, oracle agent",
        )
    out.result({"reports": reports})


if __name__ == "__main__":
    main()
