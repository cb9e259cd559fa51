"""``slr check-tasks``: run tasks end to end with the oracle and nop agents (no model).

The agents are the core's own (``slr.agents.model_free``), run by
``slr.rollout.task_check``; ``slr eval`` runs them too, and agents that call the policy."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slr.contracts import TrialResult, to_dict
from slr.plugins import make_plugin
from slr.rollout.task_check import run_task_check
from slr.tasks import load_tasks


def _common(fn):
    for deco in reversed(
        [
            click.option(
                "--backend", default="docker", show_default=True, help="Sandbox backend plugin."
            ),
            click.option(
                "--backend-opt",
                "backend_opts",
                multiple=True,
                metavar="KEY=VALUE",
                help="A backend option, e.g. --backend-opt isolation=bubblewrap (repeatable).",
            ),
            click.option(
                "--verifier", default="harbor", show_default=True, help="Verifier plugin."
            ),
            click.option(
                "-j", "--concurrency", default=4, show_default=True, help="Trials at once."
            ),
            click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table."),
        ]
    ):
        fn = deco(fn)
    return fn


def _cell(results: list[TrialResult]) -> str:
    parts = []
    for r in results:
        parts.append(f"{r.reward.value:g}" if r.reward is not None else "-")
    terms = Counter(str(r.termination) for r in results)
    text = " ".join(parts)
    odd = {t: n for t, n in terms.items() if t != "completed"}
    if odd:
        text += " (" + ", ".join(f"{t}×{n}" if n > 1 else t for t, n in odd.items()) + ")"
    return text


@click.command("check-tasks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@_common
def check_tasks(paths, backend, backend_opts, verifier, concurrency, as_json) -> None:
    """Validate Harbor tasks: the oracle must score 1 and nop must score 0.

    \b
    PATHS are task folders, folders of tasks, or .parquet task indexes.
      slr check-tasks examples/tasks --backend docker
    Exits 1 when any task fails the check (broken build, oracle below 1, nop above 0).
    """
    tasks = [t for p in paths for t in load_tasks(p)]
    results = asyncio.run(
        run_task_check(
            tasks,
            repeats=1,
            backend=make_plugin("sandbox_backend", backend, backend_opts),
            verifier=make_plugin("verifier", verifier),
            concurrency=concurrency,
        )
    )
    by: dict[tuple[str, str], list[TrialResult]] = defaultdict(list)
    for r in results:
        by[(r.task_id, r.agent or "")].append(r)
    rows, bad = [], 0
    for t in tasks:
        oracle, nop = by[(t.id, "oracle")], by[(t.id, "nop")]
        ok = all(
            r.reward is not None and r.reward.value == 1.0 and str(r.termination) == "completed"
            for r in oracle
        ) and all(r.reward is not None and r.reward.value == 0.0 for r in nop)
        bad += not ok
        errors = "; ".join(r.error for r in oracle + nop if r.error)
        rows.append((t.id, _cell(oracle), _cell(nop), "ok" if ok else "FAIL", errors))
    if as_json:
        click.echo(json.dumps([to_dict(r) for r in results], indent=2, default=str))
    else:
        table = Table("task", "oracle", "nop", "check", "error", title=f"tasks on {backend}")
        for row in rows:
            table.add_row(
                *row[:3],
                f"[green]{row[3]}[/]" if row[3] == "ok" else f"[red]{row[3]}[/]",
                row[4][:300],
            )
        Console().print(table)
    if bad:
        raise SystemExit(1)
