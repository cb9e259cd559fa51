"""The CPU quickstart over several seeds, and optionally two configs or commits side by side.

    .venv/bin/python bench/quickstart_seeds.py --seeds 0 1 2 3 4          # ~15 min a seed
    .venv/bin/python bench/quickstart_seeds.py --seeds 0 --repeat 2       # reproducible?
    .venv/bin/python bench/quickstart_seeds.py --seeds 0 1 --config examples/quickstart/slr.toml \\
        --config my.toml                                                  # two configs
    .venv/bin/python bench/quickstart_seeds.py --seeds 0 1 --rev HEAD~5 --rev HEAD   # two commits
    .venv/bin/python bench/quickstart_seeds.py --seeds 0 --set rollout.tasks_per_step=4 --json out.json

Each run is what ``examples/quickstart/run.sh`` does, with ``[run] seed`` set: the base
model on the held-out tasks (``slr eval -k K``), training (``slr run``), the trained
checkpoint on the same tasks. One learning curve is one sample of a noisy process, so the
quickstart's claims are made over seeds: per seed the base and trained held-out pass@1, the
gain, the training pass rate per step and the wall times; per variant the mean, the range
and the worst gain. ``--repeat 2`` runs every seed twice, and reports how far the two
held-out results and the two training curves lie apart (a seeded run should repeat itself:
each call's sampling seed derives from the run's seed, the trial id and the call number).

A ``--rev`` is checked out (``git worktree``) into the output folder and run with that
commit's sources first on ``PYTHONPATH`` (same venv: a commit whose dependencies differ
from the checkout's needs its own). Without ``--config`` or ``--rev`` the variant is the
checkout's ``examples/quickstart/slr.toml``. ``--set`` applies to every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

ROOT = Path(__file__).resolve().parents[1]
CONFIG = Path("examples/quickstart/slr.toml")
HELDOUT = Path("examples/quickstart/tasks/heldout")


def source_path(tree: Path) -> str:
    """The ``src`` folders of every distribution in ``tree`` (a commit's checkout)."""
    return os.pathsep.join(str(p.parent) for p in sorted(tree.glob("*/*/src/*/__init__.py")) +
                           sorted(tree.glob("*/src/*/__init__.py")))  # fmt: skip


def worktree(rev: str, out: Path) -> Path:
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = out / f"tree-{sha}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True)
    return tree


def slr(args: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
    cmd = [str(Path(sys.executable).with_name("slr")), *args]
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:1])} failed (exit {done.returncode}); see {log}")


def pass1(folder: Path) -> tuple[float, int, int]:
    e = json.loads((folder / "eval.json").read_text())
    return e["pass_at"]["1"], e["successes"], e["scored"]


def one_run(
    variant: dict[str, Any], seed: int, repeat: int, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """One quickstart: base eval, training, trained eval; what the report needs of it."""
    where = out / variant["label"] / f"seed{seed}-r{repeat}"
    where.mkdir(parents=True, exist_ok=True)
    log = where / "log.txt"
    cwd: Path = variant["tree"]
    env = dict(os.environ)
    if variant["pythonpath"]:
        env["PYTHONPATH"] = variant["pythonpath"]
    common = ["-c", str(variant["config"]), "--set", f"run.seed={seed}"]
    for s in args.set:
        common += ["--set", s]
    row: dict[str, Any] = {"variant": variant["label"], "seed": seed, "repeat": repeat}
    t0 = time.monotonic()
    if not args.no_base:
        base = where / "eval-base"
        if not (base / "eval.json").exists():
            slr(["eval", *common, "--tasks", str(HELDOUT), "-k", str(args.k), "--output",
                 str(base)], cwd=cwd, env=env, log=log)  # fmt: skip
        row["base"], row["base_successes"], row["base_scored"] = pass1(base)
    t1 = time.monotonic()
    runs = where / "train"
    if not any(runs.glob("*/checkpoints")):
        slr(["run", *common, "--set", f'run.runs_dir="{runs}"'], cwd=cwd, env=env, log=log)
    run_dir = sorted(p.parent for p in runs.glob("*/checkpoints"))[-1]
    t2 = time.monotonic()
    trained = where / "eval-trained"
    if not (trained / "eval.json").exists():
        slr(["eval", *common, "--tasks", str(HELDOUT), "-k", str(args.k), "--checkpoint",
             str(run_dir), "--output", str(trained)], cwd=cwd, env=env, log=log)  # fmt: skip
    t3 = time.monotonic()
    row["trained"], row["trained_successes"], row["trained_scored"] = pass1(trained)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    row["train_pass_rate"] = [round(m.get("reward/pass_rate", 0.0), 3) for m in metrics]
    row["oversampled"] = sum(m.get("groups/oversampled", 0) for m in metrics)
    row["skipped_updates"] = sum(bool(m.get("update/skipped")) for m in metrics)
    row["time_s"] = {"base_eval": t1 - t0, "train": t2 - t1, "trained_eval": t3 - t2}
    row["run_dir"] = str(run_dir)
    if "base" in row:
        row["gain"] = row["trained"] - row["base"]
    return row


def variants(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    found = []
    for rev in args.rev:
        tree = worktree(rev, out)
        label = f"rev-{tree.name.removeprefix('tree-')}"
        found.append({"label": label, "tree": tree, "pythonpath": source_path(tree),
                      "config": CONFIG})  # fmt: skip
    for cfg in args.config:
        found.append({"label": Path(cfg).stem, "tree": ROOT, "pythonpath": "",
                      "config": Path(cfg).resolve()})  # fmt: skip
    if not found:
        found.append({"label": "main", "tree": ROOT, "pythonpath": "", "config": CONFIG})
    return found


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == label]
        trained = [r["trained"] for r in mine]
        s: dict[str, Any] = {
            "runs": len(mine),
            "trained_mean": statistics.fmean(trained),
            "trained_min": min(trained),
            "trained_max": max(trained),
            "train_minutes_mean": statistics.fmean(sum(r["time_s"].values()) / 60 for r in mine),
        }
        if all("gain" in r for r in mine):
            s["base_mean"] = statistics.fmean(r["base"] for r in mine)
            s["gain_min"] = min(r["gain"] for r in mine)
            s["gain_mean"] = statistics.fmean(r["gain"] for r in mine)
        # the same seed run twice: how far apart the held-out results and curves are
        pairs = {}
        for r in mine:
            pairs.setdefault(r["seed"], []).append(r)
        repeats = [p for p in pairs.values() if len(p) > 1]
        if repeats:
            s["repeat_trained_max_diff"] = max(
                max(r["trained"] for r in p) - min(r["trained"] for r in p) for p in repeats
            )
            s["repeat_same_curve"] = all(
                all(r["train_pass_rate"] == p[0]["train_pass_rate"] for r in p) for p in repeats
            )
        out[label] = s
    return out


def print_table(
    rows: list[dict[str, Any]], summ: dict[str, dict[str, Any]], out: harness.Output
) -> None:
    out.table(
        [
            ("variant", "<"),
            "seed",
            "rep",
            ("base", ".2f"),
            ("trained", ".2f"),
            ("gain", "+.2f"),
            ("min", ".1f"),
            ("train pass rate per step", "<"),
        ],
        [
            [
                r["variant"],
                r["seed"],
                r["repeat"],
                r.get("base"),
                r["trained"],
                r.get("gain"),
                sum(r["time_s"].values()) / 60,
                " ".join(f"{x:.2f}" for x in r["train_pass_rate"]),
            ]
            for r in rows
        ],
    )
    out.print()
    for label, s in summ.items():
        parts = [f"trained mean {s['trained_mean']:.3f} (range {s['trained_min']:.2f}-"
                 f"{s['trained_max']:.2f})"]  # fmt: skip
        if "gain_min" in s:
            parts.append(f"base mean {s['base_mean']:.3f}, gain mean {s['gain_mean']:+.3f}, "
                         f"worst gain {s['gain_min']:+.2f}")  # fmt: skip
        if "repeat_trained_max_diff" in s:
            parts.append(f"same seed twice: held-out differs by <= "
                         f"{s['repeat_trained_max_diff']:.3f}, identical curves: "
                         f"{s['repeat_same_curve']}")  # fmt: skip
        parts.append(f"{s['train_minutes_mean']:.1f} min a run")
        out.print(f"{label}: " + "; ".join(parts))


def main() -> None:
    p = harness.parser(__doc__, json_path=True, whole_doc=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--repeat", type=int, default=1, help="runs of each seed (2: reproducible?)")
    p.add_argument("--config", action="append", default=[], help="a config to run (repeatable)")
    p.add_argument("--rev", action="append", default=[], help="a commit to run (repeatable)")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    p.add_argument("-k", type=int, default=4, help="trials per held-out task (default 4)")
    p.add_argument("--no-base", action="store_true", help="skip the base model's evaluation")
    p.add_argument("--out", type=Path, default=None, help="where the runs go (resumable)")
    args = p.parse_args()
    report_out = harness.Output(args)
    out = args.out or ROOT / "runs" / f"quickstart-seeds-{time.strftime('%Y%m%d-%H%M%S')}"
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in variants(args, out):
        for seed in args.seeds:
            for rep in range(args.repeat):
                print(f"--> {variant['label']} seed {seed} run {rep + 1}/{args.repeat}",
                      file=sys.stderr, flush=True)  # fmt: skip
                rows.append(one_run(variant, seed, rep, args, out))
                (out / "rows.jsonl").open("a").write(json.dumps(rows[-1]) + "\n")
    summ = summary(rows)
    print_table(rows, summ, report_out)
    report_out.result({"k": args.k, "set": args.set, "rows": rows, "summary": summ})


if __name__ == "__main__":
    main()
