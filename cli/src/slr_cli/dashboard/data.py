"""What the dashboard shows, read from run directories through ``slr.run.directory.RunDir`` alone.

A ``Run`` follows one run directory: its metrics and events by byte offset
(``RunDir.follow``), its trials by the names in ``trials/`` (a record is written once,
atomically, and never changes, so each is decoded once and kept as a small row). The same
views feed the live server, its event stream and the static export, so the three cannot
disagree. Nothing here writes: a run may be in flight (``RunDir.watch``).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slr.config import PLUGIN_SECTIONS
from slr.contracts import TrialResult
from slr.errors import UsageError
from slr.plugins import get_plugin_manager
from slr.proxy.server import TRANSCRIPT
from slr.run.checkpoints import latest_checkpoint
from slr.run.directory import RunDir

#: Longest agent / verifier log kept in a trial's detail view (the tail is what matters).
LOG_CHARS = 20_000

Decode = Callable[[Sequence[int]], list[str]]


def find_runs(root: Path) -> list[Path]:
    """``root`` itself when it is a run directory, else the run directories inside it."""
    root = Path(root)
    if (root / RunDir.CONFIG).is_file():
        return [root]
    if not root.is_dir():
        raise UsageError(
            f"{str(root)!r} does not exist; pass a run directory (runs/<run-id>) or the "
            "folder that holds them (the config's run.runs_dir, e.g. runs/)"
        )
    return sorted(p for p in root.iterdir() if (p / RunDir.CONFIG).is_file())


def _number(value: Any) -> float | None:
    """A finite number for JSON (NaN and infinities become None: JSON has neither)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def clean_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics line with only its numbers (what a chart can draw), step first."""
    out: dict[str, Any] = {"step": record.get("step")}
    for key, value in record.items():
        if key != "step" and (n := _number(value)) is not None:
            out[key] = n
    return out


def trial_row(trial: TrialResult) -> dict[str, Any]:
    """One trial, small: what the outcome, task grid and trial list panels need."""
    traj = trial.trajectory
    return {
        "id": trial.trial_id,
        "task": trial.task_id,
        "step": trial.step,
        "group": trial.group_id,
        "reward": None if trial.reward is None else _number(trial.reward.value),
        "termination": trial.termination.value,
        "infra": trial.termination.is_infrastructure_failure,
        "trainable": trial.trainable,
        "agent": trial.agent,
        "agent_version": trial.agent_version,
        "weights_version": trial.weights_version,
        "policy_tokens": traj.num_policy_tokens if traj else 0,
        "segments": len(traj.segments) if traj else 0,
        "calls": traj.num_calls if traj else 0,
        "seconds": _number(trial.timings.get("total_s")),
        "error": trial.error,
    }


def _tail(text: str) -> str:
    return text if len(text) <= LOG_CHARS else "…" + text[-LOG_CHARS:]


class Run:
    """One run directory, followed: a snapshot, then what was appended since."""

    def __init__(self, path: Path, *, decode: Decode | None = None) -> None:
        self.dir = RunDir.watch(path)
        self.id = self.dir.id
        self.decode = decode
        self._rows: dict[str, dict[str, Any]] = {}
        #: trial records that do not decode (left out of every panel, listed in the overview)
        self.unreadable: set[str] = set()

    # -- trials ----------------------------------------------------------------------------

    def _trial_files(self) -> list[Path]:
        folder = self.dir.path / "trials"
        return sorted(folder.glob("*.json")) if folder.is_dir() else []

    def new_trial_rows(self) -> list[dict[str, Any]]:
        """Rows of the trials recorded since the last call (each file decoded once)."""
        fresh = []
        for path in self._trial_files():
            if path.stem in self._rows or path.stem in self.unreadable:
                continue
            try:
                trial = self.dir.trial(path.stem)
            except (OSError, ValueError, TypeError, KeyError):
                # records are written whole (atomic rename): this one will not change
                self.unreadable.add(path.stem)
                continue
            row = self._rows[path.stem] = trial_row(trial)
            fresh.append(row)
        return fresh

    def trial_rows(self) -> list[dict[str, Any]]:
        self.new_trial_rows()
        return sorted(self._rows.values(), key=lambda r: ((r["step"] or 0), r["id"]))

    # -- the whole run ---------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        try:
            return tomllib.loads(self.dir.config_text())
        except (OSError, tomllib.TOMLDecodeError):
            return {}

    def plugins(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        """The plugins the run's config names, with the distribution and version installed
        here (what this machine would run it with)."""
        manager = get_plugin_manager()
        out: list[dict[str, Any]] = []
        for section, kind in PLUGIN_SECTIONS.items():
            name = (config.get(section) or {}).get("name")
            if not name:
                continue
            reg = manager.registry(kind).get(name)
            out.append(
                {
                    "role": section,
                    "name": name,
                    "distribution": reg.plugin.distribution if reg else None,
                    "version": reg.plugin.version if reg else None,
                }
            )
        recorded = {(r["agent"], r["agent_version"]) for r in self._rows.values()}
        for agent, version in sorted(recorded - {(None, None)}, key=str):
            out.append({"role": "agent, as recorded", "name": agent, "version": version})
        return out

    def snapshot(self) -> dict[str, Any]:
        """Everything a page needs to draw this run, and the offsets to follow it from."""
        metrics, metrics_at = self.dir.follow(RunDir.METRICS)
        events, events_at = self.dir.follow(RunDir.EVENTS)
        config = self.config()
        checkpoint = latest_checkpoint(self.dir)
        trials = self.trial_rows()  # first: the plugins list names the agents they recorded
        return {
            "id": self.id,
            "path": str(self.dir.path),
            "config": config,
            "config_text": self._config_text(),
            "plugins": self.plugins(config),
            "latest_checkpoint": checkpoint.name if checkpoint else None,
            "metrics": [clean_metrics(m) for m in metrics],
            "events": events,
            "trials": trials,
            "unreadable_trials": sorted(self.unreadable),
            "offsets": {"metrics": metrics_at, "events": events_at},
        }

    def _config_text(self) -> str:
        try:
            return self.dir.config_text()
        except OSError:
            return ""

    def changes(self, offsets: dict[str, int]) -> dict[str, Any]:
        """What was appended since ``offsets`` (updated in place); empty lists when nothing."""
        metrics, offsets["metrics"] = self.dir.follow(RunDir.METRICS, offsets["metrics"])
        events, offsets["events"] = self.dir.follow(RunDir.EVENTS, offsets["events"])
        return {
            "metrics": [clean_metrics(m) for m in metrics],
            "events": events,
            "trials": self.new_trial_rows(),
        }

    # -- one trial -------------------------------------------------------------------------

    def trial_detail(self, trial_id: str) -> dict[str, Any]:
        """One trial in full: its record, every segment's tokens (id, text where a
        tokenizer is known, loss mask, behaviour log-prob, weights version), and the
        proxy's transcript (each call's text and tool calls)."""
        if "/" in trial_id or trial_id.startswith(".") or not self.dir.has_trial(trial_id):
            raise KeyError(trial_id)
        trial = self.dir.trial(trial_id)
        segments = []
        for index, seg in enumerate(trial.trajectory.segments if trial.trajectory else ()):
            versions = list(seg.weights_versions) or [None] * len(seg.token_ids)
            segments.append(
                {
                    "index": index,
                    "parent": seg.parent,
                    "branch": seg.branch,
                    "branch_at": seg.branch_at,
                    "ids": list(seg.token_ids),
                    "text": self.decode(seg.token_ids) if self.decode else None,
                    "mask": list(seg.loss_mask),
                    "logprobs": [_number(x) for x in seg.logprobs],
                    "versions": versions,
                }
            )
        return {
            **trial_row(trial),
            "reward_details": trial.reward.details if trial.reward else {},
            "timings": {k: _number(v) for k, v in trial.timings.items()},
            "logs": {k: _tail(v) for k, v in trial.logs.items()},
            "segments": segments,
            "calls": self._transcript(trial_id).get("calls") or [],
            "decoded": self.decode is not None,
        }

    def _transcript(self, trial_id: str) -> dict[str, Any]:
        path = self.dir.path / "trials" / trial_id / TRANSCRIPT
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}


def tokenizer_decode(path: Path | None, config: dict[str, Any]) -> Decode | None:
    """Token ids to their text, with the ``tokenizers`` library and a ``tokenizer.json``:
    ``path`` (a file or a model folder), else the run's ``[engine] model`` when that is a
    folder on this machine. ``None`` when neither gives one: tokens are shown as ids."""
    candidates = [Path(path).expanduser()] if path else []
    model = (config.get("engine") or {}).get("model")
    if not path and isinstance(model, str) and model:
        candidates.append(Path(model).expanduser())
    for candidate in candidates:
        file = candidate / "tokenizer.json" if candidate.is_dir() else candidate
        if file.is_file():
            try:
                from tokenizers import Tokenizer
            except ImportError:
                return None
            tok = Tokenizer.from_file(str(file))
            return lambda ids: tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        if path:
            raise UsageError(
                f"--tokenizer {str(path)!r} is neither a tokenizer.json nor a folder holding "
                "one; point it at the model folder the run's engine loaded"
            )
    return None
