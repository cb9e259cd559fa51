"""k8s backend start-up figures: trial start -> first exec, and trials per minute.

A "trial" here is the sandbox part only: ``backend.start`` (pod create -> running), one
``exec("true")``, ``stop`` (delete, grace 0). Run against a real cluster:

    eval "$(scripts/k8s-up)"
    .venv/bin/python bench/k8s_start.py [--trials 16] [--concurrency 1 4 8] [--json out.json]

The task image (examples/tasks/hello-world, built by the docker builder) is loaded into the
node before timing starts. Figures are for comparison within one run on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.backend import K8sBackend

from slr.tasks import load_task

ROOT = Path(__file__).resolve().parent.parent


async def one_trial(backend: K8sBackend, task, i: int) -> float:
    t0 = time.monotonic()
    sandbox = await backend.start(task, trial_id=f"bench-{i}", labels={"slr.bench": "1"})
    try:
        res = await sandbox.exec("true")
        first_exec = time.monotonic() - t0
        assert res.ok, res
    finally:
        await sandbox.stop()
    return first_exec


async def measure(backend: K8sBackend, task, trials: int, concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def run(i: int) -> None:
        async with gate:
            latencies.append(await one_trial(backend, task, i))

    t0 = time.monotonic()
    await asyncio.gather(*(run(i) for i in range(trials)))
    wall = time.monotonic() - t0
    latencies.sort()
    return {
        "concurrency": concurrency,
        "trials": trials,
        "start_to_first_exec_median_s": round(statistics.median(latencies), 2),
        "start_to_first_exec_p90_s": round(latencies[int(0.9 * (len(latencies) - 1))], 2),
        "trials_per_min": round(trials / wall * 60, 1),
        "wall_s": round(wall, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=16, help="trials per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--namespace", default="slr-bench")
    parser.add_argument("--network", default="loopback", choices=["loopback", "policy"])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    config = K8sBackendConfig(
        namespace=args.namespace,
        network=args.network,
        containerd_address=os.environ.get("SLR_K8S_CONTAINERD", ""),
        request_ratio=0.05,  # a small dev node: let 8 pods fit at once
        max_concurrent_pods=max(args.concurrency),
    )
    backend = K8sBackend(config)
    core = backend.api.core
    if args.namespace not in {n.metadata.name for n in core.list_namespace().items}:
        core.create_namespace({"metadata": {"name": args.namespace}})
    task = load_task(ROOT / "examples" / "tasks" / "hello-world")
    rows = []
    try:
        await backend.cleanup_orphans()
        await backend.prepare(task)
        await one_trial(backend, task, -1)  # warm-up: first pod of the image on the node
        for c in args.concurrency:
            rows.append(await measure(backend, task, args.trials, c))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        await backend.close()
    print()
    print("| concurrent | k8s start -> first exec (median / p90) | k8s trials/min |")
    print("| --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['start_to_first_exec_median_s']} s / "
            f"{r['start_to_first_exec_p90_s']} s | {r['trials_per_min']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
