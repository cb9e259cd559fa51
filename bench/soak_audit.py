"""What a run directory says happened to its trials: the soak's figures, counted after the run.

Everything here reads the run directory only (trial records, ``trials/discarded/``,
``metrics.jsonl``, the checkpoints' ``loop.json``), never what a fault injector believes it
did, so a figure is what a user of the run would find. ``audit(run_path)`` returns:

- ``trials_recorded``: every trial record, kept or discarded (a trial that started and
  ended, whatever its end);
- ``completed``, ``infra_failures`` (by termination), ``other_failures``: the kept records;
- ``trained_trials``: the trials of the groups the checkpoints say were trained;
- ``lost``: a sample of a trained group with no record of its own or of a retry (goal 0);
- ``counted_twice``: trials the trainer counted beyond the distinct trials of its groups,
  plus groups trained in two steps (goal 0);
- ``steps_trained_on_infra``: steps whose trained groups hold more infrastructure failures
  than the optimizer says it left out (goal 0);
- ``steps`` and ``metrics_steps``: steps checkpointed, and metric lines (each step once).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

from slr.contracts import TerminationReason, TrialResult
from slr.contracts.serialize import decode
from slr.run import checkpoints
from slr.run.directory import RunDir


def _records(folder: Path) -> list[tuple[TrialResult, float]]:
    out = []
    for p in sorted(folder.glob("*.json")):
        if p.name.endswith(".proxy.json"):
            continue
        try:
            out.append((decode(p.read_bytes(), TrialResult), p.stat().st_mtime))
        except Exception:  # a record that does not decode is a corrupt run directory
            out.append((TrialResult(trial_id=p.stem, task_id="?", termination="sandbox_error",
                                    error="CORRUPT RECORD"), p.stat().st_mtime))  # fmt: skip
    return out


def trained_groups_per_step(path: Path) -> dict[int, list[str]]:
    """The groups each checkpointed step trained on (from the cumulative lists)."""
    out: dict[int, list[str]] = {}
    before: set[str] = set()
    folder = path / "checkpoints"
    for ckpt in sorted(folder.glob("step-*")):
        if not checkpoints.is_complete(ckpt):
            continue
        state = checkpoints.read_state(ckpt)
        now = set(state.trained_groups)
        out[state.step] = sorted(now - before)
        before |= now
    return out


def audit(run_path: Path, *, n_per_task: int) -> dict[str, Any]:
    run = RunDir.open(run_path)
    kept = _records(run.path / "trials")
    discarded = _records(run.path / "trials" / "discarded")
    by_id = {t.trial_id: t for t, _ in kept}
    terminations = Counter(t.termination.value for t, _ in kept)
    infra = sum(
        n for k, n in terminations.items() if TerminationReason(k).is_infrastructure_failure
    )
    corrupt = sum(1 for t, _ in kept + discarded if t.error == "CORRUPT RECORD")

    per_step = trained_groups_per_step(run.path)
    metrics = {m["step"]: m for m in run.metrics()}
    metric_lines = [m["step"] for m in run.metrics()]

    def final(trial_id: str) -> TrialResult | None:
        """The last attempt of a sample (a retry stands for a trial lost with its worker)."""
        found, attempt, current = None, 0, trial_id
        while current in by_id:
            found = by_id[current]
            if found.termination is not TerminationReason.WORKER_LOST:
                break
            attempt += 1
            current = f"{trial_id}-r{attempt}"
        return found

    lost = 0
    counted_twice = 0
    infra_steps = 0
    trained_ids: set[str] = set()
    seen_groups: Counter[str] = Counter()
    for step, groups in sorted(per_step.items()):
        step_trials: list[TrialResult] = []
        for gid in groups:
            seen_groups[gid] += 1
            for k in range(n_per_task):
                t = final(f"{gid}-{k}")
                if t is None:
                    lost += 1
                    continue
                step_trials.append(t)
                trained_ids.add(t.trial_id)
        m = metrics.get(step, {})
        if "trials/total" in m:
            counted_twice += max(0, int(m["trials/total"]) - len(step_trials))
        infra_here = sum(t.termination.is_infrastructure_failure for t in step_trials)
        if int(m.get("trials/excluded_infra", infra_here)) < infra_here:
            infra_steps += 1
    counted_twice += sum(n - 1 for n in seen_groups.values() if n > 1)
    counted_twice += sum(n - 1 for n in Counter(metric_lines).values() if n > 1)
    return {
        "trials_recorded": len(kept) + len(discarded),
        "kept": len(kept),
        "discarded": len(discarded),
        "completed": terminations.get("completed", 0),
        "infra_failures": infra,
        "other_failures": len(kept) - infra - terminations.get("completed", 0),
        "terminations": dict(sorted(terminations.items())),
        "trained_trials": len(trained_ids),
        "lost": lost,
        "counted_twice": counted_twice,
        "steps_trained_on_infra": infra_steps,
        "steps": max(per_step, default=0),
        "metrics_steps": len(metric_lines),
        "corrupt_records": corrupt,
        "events": Counter(e.get("event") for e in run.events()),
    }


def record_times(run_path: Path) -> list[tuple[float, str]]:
    """(wall time written, termination) of every kept trial record, oldest first."""
    return sorted((mtime, t.termination.value) for t, mtime in _records(run_path / "trials"))


def first_progress_after(run_path: Path, when: float) -> float | None:
    """Seconds from ``when`` (wall clock) to the run's next progress: the first completed
    trial recorded after it, or the run finishing (a fault after the last trial)."""
    found = [
        m for m, termination in record_times(run_path) if m >= when and termination == "completed"
    ]
    for event in RunDir(run_path).events():
        if event.get("event") == "finished" and event.get("status") == "completed":
            at = dt.datetime.fromisoformat(event["time"]).timestamp()
            if at >= when:
                found.append(at)
    return min(found) - when if found else None


if __name__ == "__main__":  # python bench/soak_audit.py RUN_DIR N_PER_TASK
    import sys

    print(json.dumps(audit(Path(sys.argv[1]), n_per_task=int(sys.argv[2])), default=str))
