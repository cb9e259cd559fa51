"""``slr status``: where a run stands, read from its run directory alone."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slr.errors import UsageError
from slr.rollout.costs import PHASES, cost_means_by_step
from slr.run.checkpoints import latest_checkpoint
from slr.run.directory import RunDir


def state_of(run: RunDir, events: list[dict]) -> tuple[str, dict | None]:
    """``running`` (a live process holds the run), the status its ``finished`` event gave
    (``completed``, ``failed``, ``interrupted``), or ``stopped``: no process holds it and it
    never finished (killed: resume it). Also the holder (pid, host, since, command)."""
    holder = run.holder()
    if holder is not None:
        return "running", holder
    finished = [e for e in events if e.get("event") == "finished"]
    started = [e for e in events if e.get("event") == "started"]
    if finished and (not started or started[-1]["time"] <= finished[-1]["time"]):
        return str(finished[-1].get("status", "completed")), None
    return "stopped", None


def _steps_planned(run: RunDir) -> int | None:
    try:
        return int(tomllib.loads(run.config_text()).get("run", {}).get("steps", 1))
    except (tomllib.TOMLDecodeError, TypeError, ValueError):
        return None


def runs_in(folder: Path) -> list[Path]:
    """The run directories directly under ``folder``, oldest first (by creation)."""
    found = [p for p in folder.iterdir() if (p / RunDir.CONFIG).is_file()]
    return sorted(found, key=lambda p: ((p / RunDir.CONFIG).stat().st_mtime, p.name))


def pick_run(path: Path) -> Path:
    """``path`` itself when it is a run directory; the newest run when it is a folder of
    runs (``run.runs_dir``)."""
    if (path / RunDir.CONFIG).is_file() or not path.is_dir():
        return path
    found = runs_in(path)
    if not found:
        raise UsageError(
            f"{str(path)!r} is neither a run directory nor a folder of runs; pass runs/<run-id>"
        )
    return found[-1]


def summarize(run: RunDir) -> dict:
    trials = list(run.trials())
    terminations = Counter(t.termination.value for t in trials)
    rewards = [t.reward.value for t in trials if t.trainable and t.reward is not None]
    metrics = run.metrics()
    checkpoint = latest_checkpoint(run)
    events = run.events()
    state, holder = state_of(run, events)
    return {
        "run_id": run.id,
        "path": str(run.path),
        "state": state,
        "live": holder,
        "steps_done": metrics[-1]["step"] if metrics else 0,
        "steps_planned": _steps_planned(run),
        "trials": len(trials),
        "terminations": dict(sorted(terminations.items())),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "latest_checkpoint": checkpoint.name if checkpoint else None,
        "last_event": events[-1]["event"] if events else None,
        "last_event_time": events[-1].get("time") if events else None,
        "last_metrics": metrics[-1] if metrics else None,
        "costs_per_step": {
            ("-" if step is None else str(step)): means
            for step, means in sorted(
                cost_means_by_step(trials).items(), key=lambda kv: (kv[0] is None, kv[0] or 0)
            )
        },
    }


@click.command()
@click.argument(
    "path", required=False, default="runs", type=click.Path(file_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--all", "every", is_flag=True, help="One line per run in a folder of runs.")
def status(path: Path, as_json: bool, every: bool) -> None:
    """Show a run's progress: state, steps, trials by termination, reward, last checkpoint.

    \b
    Examples:
      slr status runs/quickstart-20261130-101500
      slr status                     the newest run under ./runs
      slr status runs --all --json   every run there, and which are in flight

    PATH is a run directory, or a folder of runs (default: runs), for its newest run. Safe
    to call while the run is going: it only reads. `state` is running (a live process
    holds the run: `live` names its pid, host and command), completed / failed /
    interrupted (how it finished), or stopped (killed before it finished: resume it with
    `slr run --resume PATH`).
    """
    if every:
        if not path.is_dir():
            raise UsageError(f"{str(path)!r} is not a folder of runs")
        rows = []
        for found in runs_in(path):
            run = RunDir(found)
            metrics = run.metrics()
            state, holder = state_of(run, run.events())
            rows.append(
                {
                    "run_id": run.id,
                    "path": str(found),
                    "state": state,
                    "live": holder,
                    "steps_done": metrics[-1]["step"] if metrics else 0,
                }
            )
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        table = Table("run", "state", "steps", "pid", title=f"runs in {path}")
        for row in rows:
            pid = str(row["live"].get("pid", "?")) if row["live"] is not None else "-"
            table.add_row(row["run_id"], row["state"], str(row["steps_done"]), pid)
        Console().print(table)
        return
    info = summarize(RunDir.watch(pick_run(path)))  # read-only: the run may be writing
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    table = Table(show_header=False, title=f"run {info['run_id']}")
    for key, value in info.items():
        if key in ("run_id", "costs_per_step", "last_metrics"):
            continue
        if key == "live" and value is not None:
            value = f"pid {value.get('pid', '?')} on {value.get('host', '?')} since " + str(
                value.get("since", "?")
            )
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
