"""``slr status``: where a run stands, read from its run directory alone."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slr.checkpoints import latest_checkpoint
from slr.costs import PHASES, cost_means_by_step
from slr.runs import RunDir


def summarize(run: RunDir) -> dict:
    trials = list(run.trials())
    terminations = Counter(t.termination.value for t in trials)
    rewards = [t.reward.value for t in trials if t.trainable and t.reward is not None]
    metrics = run.metrics()
    checkpoint = latest_checkpoint(run)
    events = run.events()
    return {
        "run_id": run.id,
        "path": str(run.path),
        "steps_done": metrics[-1]["step"] if metrics else 0,
        "trials": len(trials),
        "terminations": dict(sorted(terminations.items())),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "latest_checkpoint": checkpoint.name if checkpoint else None,
        "last_event": events[-1]["event"] if events else None,
        "costs_per_step": {
            ("-" if step is None else str(step)): means
            for step, means in sorted(
                cost_means_by_step(trials).items(), key=lambda kv: (kv[0] is None, kv[0] or 0)
            )
        },
    }


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(run_dir: Path, as_json: bool) -> None:
    """Show a run's progress: steps, trials by termination, reward, last checkpoint.

    RUN_DIR is a run directory such as runs/quickstart-20261130-101500. Safe to call while
    the run is going: it only reads.
    """
    info = summarize(RunDir.watch(run_dir))  # read-only: the run may be writing
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    table = Table(show_header=False, title=f"run {info['run_id']}")
    for key, value in info.items():
        if key not in ("run_id", "costs_per_step"):
            table.add_row(key.replace("_", " "), "-" if value is None else str(value))
    console = Console()
    console.print(table)
    if info["costs_per_step"]:
        console.print(costs_table(info["costs_per_step"]))


def costs_table(per_step: dict[str, dict[str, float]]) -> Table:
    """Seconds per trial (mean) in each phase, wall / sandbox CPU, one row per step."""
    table = Table(title="cost per trial, mean: wall s / sandbox CPU s (- not measured)")
    table.add_column("step")
    for phase in PHASES:
        table.add_column(phase.replace("_", " "), justify="right")
    table.add_column("fixed wall", justify="right")
    table.add_column("pooled", justify="right")
    for step, means in per_step.items():
        cells = []
        for phase in PHASES:
            cpu = means.get(f"cost/cpu/{phase}_s")
            wall = means.get(f"cost/wall/{phase}_s", 0.0)
            cells.append(f"{wall:.2f} / " + ("-" if cpu is None else f"{cpu:.2f}"))
        table.add_row(
            step,
            *cells,
            f"{means['cost/fixed_wall_s']:.2f}",
            f"{means['cost/pooled_fraction']:.0%}",
        )
    return table
