"""``slr infer``: run an agent with a model over a task set, no training, and export what it did.

An inference is an evaluation (``slr.run.evaluation.Evaluation``: the same parts built from the
config, the same ``TrialRecorder``, the same run directory and ``eval.json``) whose trials
keep the agent's final change to the repository (``TrialSpec.capture_diff``, recorded as
``TrialResult.diff``). Two exports are then written from the run directory alone, so they
can be re-made from a finished or resumed run:

- SWE-bench predictions (``predictions.jsonl``, or ``predictions-<i>.jsonl`` per sample
  ``i`` when ``-k`` > 1, so each file has one line per instance as the SWE-bench harness
  expects): ``instance_id`` (the task's ``[metadata] instance_id``, else its id),
  ``model_name_or_path``, ``model_patch``. A trial that ended before its diff was taken (an
  infrastructure failure) has no line.
- rejection-sampled SFT data (``sft.jsonl``): one line per rewarded trial (reward at least
  ``threshold``, not an infrastructure failure) with its conversation as chat messages, the
  proxy's record of the last call plus its reply (``proxy.json``'s ``messages``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from slr.contracts import TrialResult
from slr.rollout.recorder import TrialSpec
from slr.run.directory import RunDir, atomic_write
from slr.run.evaluation import Evaluation
from slr.tasks import Task

PREDICTIONS = "predictions.jsonl"
SFT = "sft.jsonl"
TRANSCRIPT = "proxy.json"


class Inference(Evaluation):
    """An ``Evaluation`` whose trials capture the agent's diff; ``export`` writes the files."""

    def specs(self) -> list[TrialSpec]:
        return [attrs.evolve(spec, capture_diff=True) for spec in super().specs()]


def instance_id(task: Task) -> str:
    """The id a SWE-bench prediction carries: the imported instance's, else the task's."""
    value = task.metadata.get("instance_id")
    return str(value) if value else task.id


def prediction_files(samples: int) -> list[str]:
    if samples == 1:
        return [PREDICTIONS]
    return [f"predictions-{i}.jsonl" for i in range(samples)]


def _jsonl(rows: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_predictions(
    run: RunDir, specs: list[TrialSpec], *, samples: int, model: str
) -> dict[str, int]:
    """One predictions file per sample index; returns lines written per file."""
    by_sample: list[list[dict[str, Any]]] = [[] for _ in range(samples)]
    for n, spec in enumerate(specs):
        if not run.has_trial(spec.trial_id):
            continue
        trial = run.trial(spec.trial_id)
        if trial.diff is None:
            continue
        by_sample[n % samples].append(
            {
                "instance_id": instance_id(spec.task),
                "model_name_or_path": model,
                "model_patch": trial.diff,
            }
        )
    written = {}
    for name, rows in zip(prediction_files(samples), by_sample, strict=True):
        atomic_write(run.path / name, _jsonl(rows))
        written[name] = len(rows)
    return written


def rewarded(trial: TrialResult, threshold: float) -> bool:
    return trial.trainable and trial.reward is not None and trial.reward.value >= threshold


def sft_row(run: RunDir, trial: TrialResult) -> dict[str, Any] | None:
    """A chat-messages SFT line for ``trial``, or None when the proxy recorded no call."""
    path = run.path / "trials" / trial.trial_id / TRANSCRIPT
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    messages = doc.get("messages") or []
    if not messages:
        return None
    assert trial.reward is not None  # only rewarded trials get here
    return {
        "messages": messages,
        # JSON text: tool schemas differ in shape, which a columnar loader cannot unify
        "tools": json.dumps(doc.get("tools") or []),
        "task_id": trial.task_id,
        "trial_id": trial.trial_id,
        "reward": trial.reward.value,
    }


def write_sft(run: RunDir, specs: list[TrialSpec], *, threshold: float) -> dict[str, int]:
    """``sft.jsonl`` from the rewarded trials; returns what was kept and left out, and why."""
    rows, counts = [], {"kept": 0, "not_rewarded": 0, "no_model_calls": 0}
    for spec in specs:
        if not run.has_trial(spec.trial_id):
            continue
        trial = run.trial(spec.trial_id)
        if not rewarded(trial, threshold):
            counts["not_rewarded"] += 1
            continue
        row = sft_row(run, trial)
        if row is None:
            counts["no_model_calls"] += 1
            continue
        rows.append(row)
        counts["kept"] += 1
    atomic_write(run.path / SFT, _jsonl(rows))
    return counts


def export(inference: Inference, *, sft: bool, model_name: str | None = None) -> dict[str, Any]:
    """Write the predictions (and with ``sft`` the SFT file) into the run directory."""
    from slr.run.evaluation import engine_model

    cfg = inference.config
    model = (
        model_name
        or (engine_model(cfg) if inference.engine is not None else None)
        or cfg.agent.name
    )
    specs = inference.specs()
    out: dict[str, Any] = {
        "predictions": write_predictions(
            inference.run, specs, samples=inference.samples, model=model
        ),
        "model_name_or_path": model,
    }
    if sft:
        out["sft"] = write_sft(inference.run, specs, threshold=inference.threshold)
    atomic_write(inference.run.path / "infer.json", json.dumps(out, indent=2, sort_keys=True))
    return out


def output_paths(run_path: Path, exported: dict[str, Any]) -> list[Path]:
    names = list(exported["predictions"]) + ([SFT] if "sft" in exported else [])
    return [run_path / n for n in names]
