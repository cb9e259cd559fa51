"""The preflight gate a command passes before any work, and its coloured lines (click).

``slr run``, ``slr eval`` and plugin commands that start an engine or a sandbox
(``slr infer``, ``slr data filter``) call ``gate`` with the resolved config; ``slr preflight``
prints its lines with ``echo_line``.
"""

from __future__ import annotations

from pathlib import Path

import click

from slr.plugins import get_plugin_manager
from slr.preflight import Line, Purpose, require, run_preflight

_COLOURS = {"pass": "green", "warn": "yellow", "fatal": "red"}


def echo_line(line: Line, *, err: bool = False) -> None:
    """One preflight line, its status coloured."""
    text = line.text()
    status = line.result.status
    click.echo(click.style(text[:5], fg=_COLOURS[status]) + text[5:], err=err)


def gate(config, *, purpose: Purpose, skip: bool, checkpoint: Path | None = None) -> None:
    """Run the preflight before ``purpose``: warnings and fatals are printed (stderr), and
    a fatal stops the command before an engine or a sandbox starts. ``checkpoint``: the one
    an eval serves, checked against the settings its run trained with."""
    if skip:
        return
    report = run_preflight(
        config,
        get_plugin_manager(),
        purpose=purpose,
        checkpoint=checkpoint,
        on_line=lambda line: echo_line(line, err=True) if line.result.status != "pass" else None,
    )
    click.echo(report.summary(), err=True)
    require(report, shown=True)


def skip_preflight_option(fn):
    """``--skip-preflight`` (hidden; for tests only), the ``skip`` that ``gate`` takes."""
    return click.option(
        "--skip-preflight",
        is_flag=True,
        hidden=True,
        help="Do not run the preflight checks (for tests only).",
    )(fn)
