"""Fixed cost per trial (everything but model time), with and without the warm sandbox pool.

    .venv/bin/python bench/trial_overhead.py --backend local --backend docker [--json]

Per backend, the model-free ``oracle`` agent on the ``hello-world`` example task, trials run
one after another (``--trials`` each), pool off and pool on (size 2) alternating in one run
so load drift hits both alike. Reported from each trial's own ``costs`` record (slr.costs):
start → agent phase (``sandbox_start``), the whole fixed wall time, and sandbox CPU (pool
CPU included: a pooled sandbox's meter runs from its creation). Medians; ratios pool/none.
mini-swe-agent is not measured here yet (it needs an engine behind the proxy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from slr.costs import fixed_wall_s
from slr.plugins import get_plugin_manager
from slr.sandboxing.pool import SandboxPool
from slr.tasks import load_task
from slr.trial import StandInSessions, bundle_mounts, new_trial_id, run_trial

ROOT = Path(__file__).resolve().parents[1]


async def one(backend, task, agent, verifier) -> dict:
    result = await run_trial(
        task,
        backend=backend,
        agent=agent,
        verifier=verifier,
        session_factory=StandInSessions(),
        trial_id=new_trial_id("bench"),
        labels={"slr.bench": "1"},
    )
    assert result.costs is not None and result.reward is not None, result.error
    c = result.costs
    return {
        "start_s": c.wall_s["sandbox_start"],
        "fixed_wall_s": fixed_wall_s(c),
        "cpu_s": sum(c.cpu_s.values()) if c.cpu_s else None,
        "pooled": c.pool_start_s is not None,
    }


async def bench(name: str, trials: int) -> dict:
    pm = get_plugin_manager()
    backend = pm.get("sandbox_backend", name).create()
    agent = pm.get("agent", "oracle").create()
    verifier = pm.get("verifier", "harbor").create()
    task = load_task(ROOT / "examples" / "tasks" / "hello-world")
    await backend.prepare(task)
    pool = SandboxPool(backend, size=2, mounts=bundle_mounts(agent.bundle()))
    pool.expect([task] * trials)
    rows: dict[str, list[dict]] = {"none": [], "pool": []}
    await one(backend, task, agent, verifier)  # warm-up
    for _ in range(trials):
        rows["none"].append(await one(backend, task, agent, verifier))
        await pool.wait_ready()  # a warm sandbox is what the pool is for
        rows["pool"].append(await one(pool, task, agent, verifier))
    await pool.close()  # closes the backend too
    out: dict = {"backend": name, "agent": "oracle", "trials": trials}
    for mode, rs in rows.items():
        cpus = [r["cpu_s"] for r in rs if r["cpu_s"] is not None]
        out[mode] = {
            "start_s": round(statistics.median(r["start_s"] for r in rs), 4),
            "fixed_wall_s": round(statistics.median(r["fixed_wall_s"] for r in rs), 4),
            "cpu_s": round(statistics.median(cpus), 4) if cpus else None,
            "pooled": sum(r["pooled"] for r in rs),
        }
    out["start_ratio"] = round(out["pool"]["start_s"] / out["none"]["start_s"], 3)
    out["fixed_wall_ratio"] = round(out["pool"]["fixed_wall_s"] / out["none"]["fixed_wall_s"], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", action="append", help="local (default) and/or docker")
    p.add_argument("--trials", type=int, default=8, help="trials per mode and backend")
    p.add_argument("--json", action="store_true", help="print one JSON object after the table")
    args = p.parse_args()
    from slr import log

    log.configure(level="warning")
    reports = [asyncio.run(bench(b, args.trials)) for b in args.backend or ["local"]]
    print(f"{'backend':8} {'mode':5} {'start s':>8} {'fixed wall s':>13} {'sandbox CPU s':>14}")
    for r in reports:
        for mode in ("none", "pool"):
            m = r[mode]
            cpu = "-" if m["cpu_s"] is None else f"{m['cpu_s']:.3f}"
            print(
                f"{r['backend']:8} {mode:5} {m['start_s']:8.3f} {m['fixed_wall_s']:13.3f} {cpu:>14}"
            )
        print(
            f"{r['backend']:8} ratio pool/none: start {r['start_ratio']}, "
            f"fixed wall {r['fixed_wall_ratio']}"
        )
    if args.json:
        print(json.dumps({"reports": reports}))


if __name__ == "__main__":
    main()
