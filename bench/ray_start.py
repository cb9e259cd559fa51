"""What Ray costs a run on one machine: starting the local Ray, and an engine as an actor.

    python bench/ray_start.py [--runs 3] [--run-dir runs/quickstart-...] [--json]

Measures, side by side in one process per run (each run a fresh child process, so nothing is
warm but the OS page cache):

* ``ray_start_s``: ``slr.cluster.ray_runtime.connect()`` (a private local Ray on 127.0.0.1) until
  it answers a trivial task, and the resident memory of every Ray process it started (GCS,
  raylet, workers) plus what the driver grew by;
* ``replica_start_s``: one engine replica actor loading the packaged SmolLM2
  (``[run] engine_replicas = 1``) until it answers, beside ``embedded_start_s``: the same
  engine built in the driver (what ``engine_replicas = 0`` pays);
* with ``--run-dir`` (a finished quickstart run), the run's wall time from its
  ``metrics.jsonl`` (sum of ``time/step_s``), or that time given as ``--quickstart-s``, and
  Ray's extra start cost (Ray's start, plus the replica's start beyond the embedded
  engine's) as a share of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    parent = {int(a): int(b) for a, b in (line.split() for line in out.splitlines())}
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return found


def one_run() -> dict:
    import os

    import ray

    from slr.cluster import ray_runtime
    from slr.cluster.engines import start_engine_replicas
    from slr.config import load_config
    from slr.plugins import get_plugin_manager

    me = os.getpid()
    rss0 = harness.rss_mb(me)
    t = time.perf_counter()
    connection = ray_runtime.connect("local")
    ray.get(ray.remote(lambda: 1).remote())
    ray_s = time.perf_counter() - t
    ray_rss = sum(harness.rss_mb(pid) for pid in [*children(me), me]) - rss0

    config = load_config(
        data={"run": {"engine_replicas": 1}, "engine": {"name": "hf", "threads": 1}},
        plugins=get_plugin_manager(),
        only_plugins=("engine",),
    )
    t = time.perf_counter()
    replicas = start_engine_replicas(config)
    replica_s = time.perf_counter() - t
    import asyncio

    asyncio.run(replicas.close())
    connection.release()

    from slr_engine_hf.engine import HfEngine

    t = time.perf_counter()
    engine = HfEngine(config.engine.options)
    embedded_s = time.perf_counter() - t
    asyncio.run(engine.close())
    return {
        "ray_start_s": round(ray_s, 2),
        "ray_rss_mb": round(ray_rss),
        "replica_start_s": round(replica_s, 2),
        "embedded_start_s": round(embedded_s, 2),
    }


def run_wall_s(run_dir: Path) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return sum(json.loads(line).get("time/step_s", 0.0) for line in lines if line.strip())


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--run-dir", type=Path, help="a finished quickstart run, for the share")
    ap.add_argument(
        "--quickstart-s", type=float, help="the quickstart's wall time in s, without a run dir"
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # to the parent, which reads the last line
        print(json.dumps(one_run()))
        return
    out = harness.Output(args)
    runs = []
    for _ in range(args.runs):
        child = subprocess.run(
            [sys.executable, __file__, "--one"], check=True, capture_output=True, text=True
        )
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    report: dict = {"runs": runs}
    for key in runs[0]:
        values = [r[key] for r in runs]
        report[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    extra = report["ray_start_s"]["median"] + (
        report["replica_start_s"]["median"] - report["embedded_start_s"]["median"]
    )
    report["ray_extra_start_s"] = round(extra, 2)
    wall = run_wall_s(args.run_dir) if args.run_dir is not None else args.quickstart_s
    if wall is not None:
        report["quickstart_wall_s"] = round(wall, 1)
        report["ray_share_of_quickstart"] = round(extra / wall, 4) if wall else None
    out.table(
        [("measure", "<"), ("median", "g"), ("min", "g"), ("max", "g")],
        [[key, report[key]["median"], report[key]["min"], report[key]["max"]] for key in runs[0]],
    )
    note = f"Ray's extra start cost: {extra:.2f} s"
    if "quickstart_wall_s" in report and report["ray_share_of_quickstart"] is not None:
        share = report["ray_share_of_quickstart"]
        note += f" = {100 * share:.1f}% of the quickstart's {report['quickstart_wall_s']} s"
    elif "quickstart_wall_s" not in report:
        note += " (pass --run-dir RUN to compare with a quickstart run)"
    out.print(note)
    out.result(report)


if __name__ == "__main__":
    main()
