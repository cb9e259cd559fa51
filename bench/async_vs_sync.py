"""Sync vs async training, side by side in one run: throughput and time to reach a pass rate.

    .venv/bin/python bench/async_vs_sync.py --quick          # minutes: tiny model, oracle
    .venv/bin/python bench/async_vs_sync.py                  # the CPU quickstart, twice (hours)
    .venv/bin/python bench/async_vs_sync.py --quick --only long-tail --json out.json
    .venv/bin/python bench/async_vs_sync.py --only quickstart --seeds 0 1 2   # 3 runs a mode
    .venv/bin/python bench/async_vs_sync.py --only quickstart --engine vllm  # the real vLLM

Two task sets, each trained twice (``run.mode = "sync"`` then ``"async"``) with the same
config, model and number of trained trials (``steps`` x ``tasks_per_step`` x ``n_per_task``):

1. ``quickstart``: examples/quickstart/tasks/train with the quickstart's config
   (SmolLM2-135M, mini-swe-agent); held-out pass@1 of both trained checkpoints is measured
   with ``slr eval`` on examples/quickstart/tasks/heldout. ``--quick`` swaps in a tiny
   random model and the ``oracle`` agent, so it measures the loops' overheads only (and
   skips the held-out evaluation: the oracle's pass@1 is 1 by construction).
2. ``long-tail``: tasks the bench writes itself, copies of the hello-world task whose
   tests wait on a tool (``sleep``, not CPU) before checking; one task in four waits 10x
   longer. The synchronous loop waits for the slowest trial of every step, and its trials
   run their phases in lockstep (all CPU at once, then all waiting); the asynchronous one
   keeps its slots busy. Goal: >= 2x trials per hour.

``--engine vllm`` rolls out with the real vLLM server instead of the embedded hf engine
(``examples/quickstart/slr-vllm.toml``'s ``[engine]``: out of process, weights from disk;
``bash scripts/setup-vllm`` builds it): its asynchronous runs pause generations at a token
boundary for every weight update and resume them under the new weights. The held-out
evaluation serves every checkpoint with the hf engine (the same weights), so the pass@1
columns compare the training, not the evaluating engine.

``--modes`` runs only the modes named; ``--correction PRESET`` sets
``[algorithm.rollout_correction] preset`` (verl's off-policy correction) in every run.
``--seeds`` trains each mode once per seed (``[run] seed``; the async loop's timing makes
even one seed differ from run to run): one run per mode is one sample of a noisy learning
curve, so the pass rates are compared as means over the seeds, with their spread.

Reported per run: wall time, the loop's own time (the steps, without start-up), trials per
hour (trained trials / wall, and / loop time), the first step at which a 3-step moving
average of the training pass rate (``reward/pass_rate``) is >= 0.8 and the loop time until
then, held-out pass@1, how long the async trainer waited for batches and the rollouter for
admission, the optimizer's time, and the mean wall time per trial of each phase
(``slr.rollout.costs``). Ratios are async / sync.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

from slr import log as slr_log
from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.run.directory import RunDir
from slr.run.training import train

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"
HELLO = ROOT / "examples" / "tasks" / "hello-world"


def long_tail_tasks(folder: Path, *, count: int, short_s: float) -> Path:
    """``count`` hello-world copies whose tests first wait on a tool; every fourth waits
    10x longer. The wait is in ``tests/test.sh`` so that it is there whatever the agent
    does (the oracle, or a model that never runs the solution)."""
    test_sh = (HELLO / "tests" / "test.sh").read_text()
    for i in range(count):
        dest = folder / f"wait-{i:02d}"
        shutil.copytree(HELLO, dest)
        wait = short_s * (10 if i % 4 == 0 else 1)
        body = test_sh.replace("#!/bin/bash\n", f"#!/bin/bash\nsleep {wait}  # a slow tool\n", 1)
        assert body != test_sh, "hello-world's test.sh no longer starts with #!/bin/bash"
        (dest / "tests" / "test.sh").write_text(body)
    return folder


def config_data(
    args: argparse.Namespace, tasks: Path, runs: Path, mode: str, *, quick: bool, seed: int = 0
):
    import tomllib

    data = tomllib.loads((QUICKSTART / "slr.toml").read_text())
    data["run"].update(
        name=mode,
        runs_dir=str(runs),
        steps=args.steps,
        mode=mode,
        checkpoint_every=args.steps,
        seed=seed,
    )
    data["tasks"] = {"path": str(tasks)}
    data["rollout"]["max_staleness"] = args.max_staleness
    if args.correction:
        data["algorithm"]["rollout_correction"] = {"preset": args.correction}
    data["agent"]["config_file"] = str(QUICKSTART / "mini.yaml")
    if args.engine == "vllm":
        data["engine"] = vllm_engine()
    if quick:
        data["agent"] = {"name": "oracle"}
        if args.engine == "hf":
            data["engine"] = {"name": "hf", "model": str(args.tiny_model)}
        data["rollout"].update(n_per_task=4, concurrency=8, max_tokens=8)
    return data


def vllm_engine() -> dict[str, Any]:
    """The quickstart's real-vLLM ``[engine]`` (slr-vllm.toml) serving the packaged SmolLM2
    folder (with ``--quick`` too: only the agent changes), its executable in the checkout."""
    import tomllib

    from slr_engine_hf.models import resolve

    engine = tomllib.loads((QUICKSTART / "slr-vllm.toml").read_text())["engine"]
    engine["model"] = str(resolve("smollm2-135m-instruct"))
    engine["executable"] = str(ROOT / engine["executable"])
    if not Path(engine["executable"]).exists():
        raise SystemExit(
            f"--engine vllm: no vLLM environment at {engine['executable']}; build it with "
            f"`bash scripts/setup-vllm`"
        )
    return engine


def reach(metrics: list[dict[str, Any]], *, goal: float = 0.8, window: int = 3):
    """(step, wall seconds) at which the moving average of the pass rate first reaches goal."""
    elapsed = 0.0
    rates: list[float] = []
    for m in metrics:
        elapsed += m.get("time/step_s", 0.0)
        rates.append(m.get("reward/pass_rate", 0.0))
        if len(rates) >= window and sum(rates[-window:]) / window >= goal:
            return m["step"], elapsed
    return None, None


def heldout_pass1(run: RunDir, out: Path) -> float | None:
    res = subprocess.run(
        [
            str(Path(sys.executable).with_name("slr")),
            "eval",
            "-c",
            str(QUICKSTART / "slr.toml"),
            "--tasks",
            str(QUICKSTART / "tasks" / "heldout"),
            "-k",
            "4",
            "--checkpoint",
            str(run.path),
            "--output",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    try:
        return float(json.loads(res.stdout)["pass_at"]["1"])
    except (ValueError, KeyError):
        print(res.stderr[-2000:], file=sys.stderr)
        return None


def one(
    args, name: str, tasks: Path, mode: str, work: Path, *, quick: bool, seed: int = 0
) -> dict[str, Any]:
    runs = work / name / f"{mode}-s{seed}"
    cfg = load_config(
        data=config_data(args, tasks, runs, mode, quick=quick, seed=seed),
        plugins=get_plugin_manager(),
    )
    t0 = time.monotonic()
    run = train(cfg)
    wall = time.monotonic() - t0
    metrics = run.metrics()
    trained = int(sum(m.get("trials/total", 0) for m in metrics))
    step, reach_s = reach(metrics)
    # the loop's own time (steps back to back), without the start-up both modes pay once
    loop_s = sum(m.get("time/step_s", 0.0) for m in metrics)
    # where a trial's wall time went, mean per trial over the run (slr.rollout.costs' phases)
    phases = sorted({k for m in metrics for k in m if k.startswith("cost/wall/")})
    costs = {
        k.removeprefix("cost/wall/"): sum(m.get(k, 0.0) for m in metrics) / len(metrics)
        for k in phases
    }
    pass1 = None
    if name == "quickstart" and not quick:
        pass1 = heldout_pass1(run, work / name / f"eval-{mode}-s{seed}")
    return {
        "set": name,
        "mode": mode,
        "seed": seed,
        "wall_s": wall,
        "loop_s": loop_s,
        "trials_trained": trained,
        "trials_per_hour": trained / wall * 3600,
        "loop_trials_per_hour": trained / loop_s * 3600 if loop_s else None,
        "trainer_wait_s": sum(m.get("time/trainer_wait_s", 0.0) for m in metrics),
        "admission_wait_s": sum(m.get("time/admission_wait_s", 0.0) for m in metrics),
        "update_s": sum(m.get("time/update_s", 0.0) for m in metrics),
        "dropped_stale": sum(m.get("groups/dropped_stale", 0) for m in metrics),
        "trial_wall_by_phase_s": costs,
        "reach_step": step,
        "reach_s": reach_s,
        "heldout_pass1": pass1,
    }


MODES = ("sync", "async")


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's runs (one per seed): means, and the held-out pass@1's range."""
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    passes = [r["heldout_pass1"] for r in rows if r["heldout_pass1"] is not None]
    return {
        "runs": len(rows),
        "trials_per_hour": mean("trials_per_hour"),
        "loop_s": mean("loop_s"),
        "reached": sum(r["reach_step"] is not None for r in rows),
        "heldout_pass1": sum(passes) / len(passes) if passes else None,
        "heldout_pass1_range": (f"{min(passes):.2f}-{max(passes):.2f}" if passes else None),
    }


def main() -> None:
    ap = harness.parser(__doc__, json_path=True)
    ap.add_argument("--quick", action="store_true", help="tiny model + oracle agent")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 10; quick 8)")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--tail-short-s", type=float, default=0.3, help="a short tool wait")
    ap.add_argument("--only", choices=["quickstart", "long-tail"], default=None)
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="train each mode once per seed"
    )
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: both")
    ap.add_argument(
        "--correction",
        default=None,
        metavar="PRESET",
        help="[algorithm.rollout_correction] preset for every run, e.g. decoupled_token_is",
    )
    ap.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="rollout engine: the embedded hf engine, or the real vLLM server (scripts/setup-vllm)",
    )
    args = ap.parse_args()
    out = harness.Output(args)
    # quick: 8 steps, since with max_staleness = 1 the async loop overlaps at most two
    # steps, and over 4 its pipeline is mostly filling and draining
    args.steps = args.steps or (8 if args.quick else 10)
    slr_log.configure(level="warning")  # the table and the JSON line are the output
    rows = []
    with tempfile.TemporaryDirectory(prefix="slr-bench-async-") as tmp:
        work = Path(tmp)
        if args.quick:
            from slr_testkit import tiny

            model, tok = tiny.tiny_model(hidden=32, layers=1)
            args.tiny_model = tiny.save(model, tok, work / "tiny")
        sets = {
            "quickstart": QUICKSTART / "tasks" / "train",
            "long-tail": long_tail_tasks(work / "tail", count=8, short_s=args.tail_short_s),
        }
        for name, tasks in sets.items():
            if args.only and name != args.only:
                continue
            for seed in args.seeds:
                for mode in args.modes:
                    rows.append(one(args, name, tasks, mode, work, quick=args.quick, seed=seed))
    out.print(f"rollout engine: {args.engine}")
    out.table(
        [
            ("set", "<"),
            ("mode", "<"),
            "seed",
            ("wall s", ".1f"),
            ("loop s", ".1f"),
            "trials",
            ("trials/h", ".0f"),
            ("loop t/h", ".0f"),
            ("reach step", "d"),
            ("reach s", ".1f"),
            ("pass@1", ".2f"),
            ("wait trn", ".1f"),
            ("wait adm", ".1f"),
            ("update", ".1f"),
        ],
        [
            [
                r["set"],
                r["mode"],
                r["seed"],
                r["wall_s"],
                r["loop_s"],
                r["trials_trained"],
                r["trials_per_hour"],
                r["loop_trials_per_hour"],
                r["reach_step"],
                r["reach_s"],
                r["heldout_pass1"],
                r["trainer_wait_s"],
                r["admission_wait_s"],
                r["update_s"],
            ]
            for r in rows
        ],
    )
    phases = sorted({k for r in rows for k in r["trial_wall_by_phase_s"]})
    if phases:
        out.table(
            [("set", "<"), ("mode", "<"), "seed", *((p[:-2], ".2f") for p in phases)],
            [
                [r["set"], r["mode"], r["seed"]]
                + [r["trial_wall_by_phase_s"].get(p, 0.0) for p in phases]
                for r in rows
            ],
            title="\nmean wall time per trial by phase (s):",
        )
    ratios, loop_ratios, means = {}, {}, {}
    for name in sorted({r["set"] for r in rows}):
        per_mode = {m: [r for r in rows if r["set"] == name and r["mode"] == m] for m in MODES}
        means[name] = {m: summary(rs) for m, rs in per_mode.items() if rs}
        for m, mean in means[name].items():
            if mean["heldout_pass1"] is not None:
                out.print(
                    f"{name}: {m} held-out pass@1 {mean['heldout_pass1']:.3f} "
                    f"(min-max {mean['heldout_pass1_range']}, {mean['runs']} run(s))"
                )
        if len(means[name]) < 2:
            continue
        sync, asyn = means[name]["sync"], means[name]["async"]
        ratios[name] = asyn["trials_per_hour"] / sync["trials_per_hour"]
        loop_ratios[name] = sync["loop_s"] / asyn["loop_s"]
        out.print(
            f"{name}: async / sync trials per hour = {ratios[name]:.2f}x "
            f"(loop time only: {loop_ratios[name]:.2f}x), means over {len(args.seeds)} seed(s)"
        )
        if sync["heldout_pass1"] is not None and asyn["heldout_pass1"] is not None:
            out.print(
                f"{name}: held-out pass@1 sync {sync['heldout_pass1']:.3f} "
                f"(min-max {sync['heldout_pass1_range']}) vs async {asyn['heldout_pass1']:.3f} "
                f"(min-max {asyn['heldout_pass1_range']}): "
                f"difference {asyn['heldout_pass1'] - sync['heldout_pass1']:+.3f}"
            )
    result = {
        "rows": rows,
        "async_over_sync_trials_per_hour": ratios,
        "async_over_sync_loop_trials_per_hour": loop_ratios,
        "means": means,
        "seeds": args.seeds,
        "correction": args.correction,
        "engine": args.engine,
        "quick": args.quick,
        "steps": args.steps,
        "max_staleness": args.max_staleness,
        "tail_short_s": args.tail_short_s,
    }
    out.result(result)


if __name__ == "__main__":
    main()
