"""``slr status``: where a run stands, read from its run directory alone."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slr.checkpoints import latest_checkpoint
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
    }


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(run_dir: Path, as_json: bool) -> None:
    """Show a run's progress: steps, trials by termination, reward, last checkpoint.

    RUN_DIR is a run directory such as runs/quickstart-20261130-101500. Safe to call while
    the run is going: it only reads.
    """
    info = summarize(RunDir.open(run_dir))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    table = Table(show_header=False, title=f"run {info['run_id']}")
    for key, value in info.items():
        if key != "run_id":
            table.add_row(key.replace("_", " "), "-" if value is None else str(value))
    Console().print(table)
