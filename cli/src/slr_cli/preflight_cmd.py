"""``slr preflight``: one line per check (the gate ``slr run`` / ``slr eval`` pass before any
work is ``slr.preflight.gate``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slr.config import EVAL_PLUGINS
from slr.config.cli import config_options, resolve_config
from slr.errors import SlrError
from slr.plugins import get_plugin_manager
from slr.preflight import Line, run_preflight
from slr.preflight.gate import echo_line


@click.command()
@config_options
@click.option(
    "--structure-only",
    is_flag=True,
    help="Only the checks that need nothing on this machine (config, plugins, pitfalls): "
    "for a config meant for another machine.",
)
@click.option(
    "--for",
    "purpose",
    type=click.Choice(["run", "eval"]),
    default="run",
    show_default=True,
    help="Which command the config is for (an eval has no optimizer and may use no model).",
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    help="With --for eval: the checkpoint (or run folder) the eval will serve, checked "
    "against the settings its run trained with.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON lines.")
def preflight(
    config_path,
    agent,
    backend,
    engine,
    optimizer,
    verifier,
    sets,
    structure_only,
    purpose,
    checkpoint,
    as_json,
) -> None:
    """Check a run config and this machine before a run: one line per check.

    \b
    Examples:
      slr preflight -c run.toml
      slr preflight -c cluster.toml --structure-only
      slr preflight -c run.toml --for eval --agent oracle
      slr preflight -c eval.toml --for eval --checkpoint runs/RUN

    \b
    Each line is pass, warn or fatal; every fatal names its fix. Checks run cheapest first
    (config, then this machine's services and headroom, then data: tasks, model, bundles)
    and stop after a stage with a fatal. Exits 1 on any fatal. `slr run` and `slr eval`
    run the same checks before they start anything.
    """
    try:
        cfg = resolve_config(
            config_path,
            agent,
            backend,
            engine,
            None if purpose == "eval" else optimizer,
            verifier,
            sets,
            only_plugins=EVAL_PLUGINS if purpose == "eval" else None,
        )
    except SlrError as exc:
        if as_json:
            click.echo(json.dumps({"check": "config", "status": "fatal", "message": str(exc)}))
        else:
            click.echo(click.style("fatal", fg="red") + f"  config: {exc}")
        raise SystemExit(1) from None

    def show(line: Line) -> None:
        if as_json:
            r = line.result
            record = {"check": line.check, "stage": line.stage, "status": r.status}
            record.update({"message": r.message, "fix": r.fix, "doc": r.doc})
            click.echo(json.dumps(record))
        else:
            echo_line(line)

    report = run_preflight(
        cfg,
        get_plugin_manager(),
        purpose=purpose,
        structure_only=structure_only,
        on_line=show,
        checkpoint=checkpoint,
    )
    if not as_json:
        click.echo(report.summary())
    if not report.ok:
        raise SystemExit(1)
