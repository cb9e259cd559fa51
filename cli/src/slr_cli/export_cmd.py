"""``slr export``: a run's trials in other tools' formats."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def export() -> None:
    """Write a run's trials in other tools' formats."""


@export.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder to write into: OUTPUT/<trial_id>/agent/trajectory.json per trial.",
)
@click.option("--trial", "trial_ids", multiple=True, help="Export only this trial id (repeatable).")
def atif(run_dir: Path, output: Path, trial_ids: tuple[str, ...]) -> None:
    """Trials as Harbor's Agent Trajectory Interchange Format (ATIF-v1.7).

    \b
    Each trial (of `slr run`, `slr eval` or `slr serve`) becomes one trajectory, laid out
    as Harbor lays out a trial's (agent/trajectory.json): the prompt, one agent step per
    model call with its tool calls, token ids and log-probs, what the agent sent back as
    the observation; the reward and termination in its `extra`.

    \b
    Example:
      slr export atif runs/quickstart-20261130-101500 -o atif/
    """
    from slr.export.atif import export as write

    written = write(run_dir, output, trial_ids=set(trial_ids) or None)
    click.echo(f"{len(written)} trajectories written to {output}")
