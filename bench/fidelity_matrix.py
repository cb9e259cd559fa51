"""The fidelity matrix: five scaffolds' sessions x three chat-template families.

    .venv/bin/python bench/fidelity_matrix.py [--write-docs] [--json]

Each scaffold's session (``slr_testkit.fidelity.scenarios``: tool calls, a sub-agent and a
compaction where the scaffold has them) is replayed through the real proxy with the
official SDK clients, answers forced through the hf engine (``force_decode``) on a tiny
fp32 model. Per cell: calls, segments captured and the minimum the template allows,
policy tokens, and the largest difference between a policy token's recorded behaviour
log-prob and a forward pass over its segment. ``--write-docs`` replaces the table in
docs/proxy.md (between its ``fidelity-matrix`` markers). The same cells are asserted in
core/tests/proxy/test_fidelity_matrix.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import harness
from attrs import asdict

from slr_testkit.fidelity import markdown_table, run_matrix, scenarios

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "core" / "proxy" / "templates"
FAMILIES = {"chatml": None, "qwen3": "qwen3_style.jinja", "llama3": "llama3_style.jinja"}
BEGIN, END = "<!-- fidelity-matrix:begin -->", "<!-- fidelity-matrix:end -->"


def main() -> None:
    p = harness.parser(__doc__, whole_doc=True)
    p.add_argument("--write-docs", action="store_true", help="update the table in docs/proxy.md")
    args = p.parse_args()
    out = harness.Output(args)
    from slr import log
    from slr_testkit.fidelity.engines import close_all, matrix_engines

    log.configure(level="warning")
    started = time.monotonic()
    templates = {f: (TEMPLATES / n).read_text() if n else None for f, n in FAMILIES.items()}
    engines, score = matrix_engines(templates)
    try:
        results = run_matrix(scenarios(), engines, score)
    finally:
        asyncio.run(close_all(engines))
    table = markdown_table(results, list(FAMILIES))
    # the docs' markdown table (--write-docs), not harness.table
    out.print(table)
    green = sum(r.green() for r in results)
    out.print(f"{green}/{len(results)} cells green in {time.monotonic() - started:.1f} s")
    if args.write_docs:
        path = ROOT / "docs" / "proxy.md"
        text = path.read_text()
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        path.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    out.result({"cells": [asdict(r) for r in results], "green": green})


if __name__ == "__main__":
    main()
