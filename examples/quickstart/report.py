"""Print the quickstart's result: held-out pass@1 before and after training, and the run.

python examples/quickstart/report.py EVAL_BASE RUN_DIR EVAL_TRAINED
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(base: Path, run: Path, trained: Path) -> None:
    b, t = (json.loads((p / "eval.json").read_text()) for p in (base, trained))
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    print(f"\nrun: {run}")
    print(f"{'step':>4}  {'train pass':>10}  {'reward':>6}  {'step s':>6}  "
          f"{'rollout':>7}  {'update':>6}  {'sync':>5}")  # fmt: skip
    for m in steps:
        print(
            f"{m['step']:>4}  {m.get('reward/pass_rate', 0):>10.2f}  "
            f"{m.get('reward/mean', 0):>6.2f}  {m.get('time/step_s', 0):>6.0f}  "
            f"{m.get('time/rollout_s', 0):>7.0f}  {m.get('time/update_s', 0):>6.0f}  "
            f"{m.get('time/sync_s', 0):>5.0f}"
        )
    print(f"\nheld-out tasks ({len(b['tasks'])}), pass@1:")
    for name, e in (("base model", b), ("after training", t)):
        print(f"  {name:<15} {e['pass_at']['1']:.2f}   ({e['successes']}/{e['scored']} trials)")
    per = [
        (tid, b["tasks"][tid]["successes"], t["tasks"][tid]["successes"], t["tasks"][tid]["n"])
        for tid in b["tasks"]
    ]
    print("  per task (successes base -> trained, of n): " + ", ".join(
        f"{tid} {x}->{y}/{n}" for tid, x, y, n in per
    ))  # fmt: skip


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:4]))
