"""``slr dashboard --export run.html``: the page with every run's data inlined, one file
that opens from disk with no server (the same views the live server sends)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from slr.run.directory import atomic_write
from slr_cli.dashboard.data import Decode, Run, find_runs
from slr_cli.dashboard.page import render_page


def export(
    root: Path,
    out: Path,
    *,
    decode_for: Callable[[dict[str, Any]], Decode | None] = lambda config: None,
) -> dict[str, int]:
    """Write the static dashboard of the run(s) at ``root`` to ``out``; what it holds."""
    runs, trials = [], {}
    for path in find_runs(root):
        run = Run(path)
        run.decode = decode_for(run.config())
        snap = run.snapshot()
        runs.append(snap)
        trials[run.id] = {row["id"]: run.trial_detail(row["id"]) for row in snap["trials"]}
    atomic_write(Path(out), render_page({"runs": runs, "trials": trials}))
    return {"runs": len(runs), "trials": sum(len(t) for t in trials.values())}
