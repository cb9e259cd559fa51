"""Task image builds: serial against ``--jobs N``, with a cold and a warm cache, in one run.

    .venv/bin/python bench/image_builds.py                 # 8 tasks, jobs 1 vs 4
    .venv/bin/python bench/image_builds.py -n 12 --jobs 4 --json

Each task is a small Python repository (a few modules and tests, copied in with the build
context) on the base image, byte-compiled at build time: what a mined or synthesised task's
image does, minus the repository's size. The images are built through
``slr_backend_docker.builds.build_images``, the code behind ``slr images build``:

1. cold, serial: every image removed first, then built with jobs = 1;
2. cold, parallel: removed again, built with jobs = N;
3. warm: built again with each setting (every tag exists: the content-hash cache).

Needs dockerd and the base image (``slr images base``). The images carry a prefix of their
own and are removed at the end.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import harness
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker.backend import DockerBackend
from slr_backend_docker.base_image import BASE_TAG
from slr_backend_docker.builds import build_images, summary

from slr import log
from slr.tasks import load_tasks


def make_tasks(root: Path, n: int, ns: str) -> None:
    for i in range(n):
        d = root / f"{ns}-t{i}"
        (d / "environment" / "repo").mkdir(parents=True)
        (d / "tests").mkdir()
        (d / "task.toml").write_text('version = "1.0"\n')
        (d / "instruction.md").write_text("Nothing to do.\n")
        (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
        for m in range(20):
            body = "\n".join(f"def f{k}(x):\n    return x * {k} + {i}\n" for k in range(50))
            (d / "environment" / "repo" / f"mod{m}.py").write_text(body)
        (d / "environment" / "Dockerfile").write_text(
            f"FROM {BASE_TAG}\nWORKDIR /app\nCOPY repo /app\n"
            "RUN python3 -m compileall -q /app && git init -q /app && "
            "git -C /app -c user.email=b@b -c user.name=b add -A && "
            "git -C /app -c user.email=b@b -c user.name=b commit -qm base\n"
        )


async def timed_build(tasks, jobs: int, prefix: str, logs: Path) -> tuple[float, dict[str, int]]:
    backend = DockerBackend(DockerBackendConfig(image_prefix=prefix), sandboxes=jobs)
    try:
        t0 = time.monotonic()
        results = await build_images(backend, tasks, jobs=jobs, log_dir=logs)
        return time.monotonic() - t0, summary(results)
    finally:
        await backend.close()


def remove_images(prefix: str) -> None:
    from slr_backend_docker.client import connect

    client = connect()
    for image in client.images.list(name=f"{prefix}-*"):
        client.images.remove(image.id, force=True)


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("-n", "--tasks", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args()
    report = harness.Output(args)
    log.configure(level="warning")  # stdout is the table and the JSON object only
    ns = f"bench-img-{uuid.uuid4().hex[:6]}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        make_tasks(Path(tmp) / "tasks", args.tasks, ns)
        tasks = load_tasks(Path(tmp) / "tasks")
        logs = Path(tmp) / "logs"
        try:
            for cache in ("cold", "warm"):
                for jobs in (1, args.jobs):
                    if cache == "cold":
                        remove_images(ns)
                    seconds, counts = asyncio.run(timed_build(tasks, jobs, ns, logs))
                    rows.append({"cache": cache, "jobs": jobs, "seconds": seconds, **counts})
        finally:
            remove_images(ns)

    def s(cache: str, jobs: int) -> float:
        return next(r["seconds"] for r in rows if r["cache"] == cache and r["jobs"] == jobs)

    out = {
        "tasks": args.tasks,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "runs": [{**r, "seconds": round(r["seconds"], 2)} for r in rows],
        "cold_speedup": round(s("cold", 1) / s("cold", args.jobs), 2),
        "warm_over_cold_serial": round(s("warm", 1) / s("cold", 1), 3),
        "cold_s_per_task_serial": round(s("cold", 1) / args.tasks, 2),
        "warm_s_per_task": round(s("warm", args.jobs) / args.tasks, 3),
    }
    report.table(
        ["cache", "jobs", ("seconds", ".2f"), "built", "cached", "failed"],
        [[r["cache"], r["jobs"], r["seconds"], r["built"], r["cached"], r["failed"]] for r in rows],
    )
    report.print(
        f"cold: jobs {args.jobs} is {out['cold_speedup']}x serial; warm serial takes "
        f"{out['warm_over_cold_serial']:.1%} of cold serial ({os.cpu_count()} CPUs, "
        f"load {out['load_avg_1m']})"
    )
    report.result(out)


if __name__ == "__main__":
    main()
