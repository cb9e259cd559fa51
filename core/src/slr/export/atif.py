"""Trials as Harbor's Agent Trajectory Interchange Format (ATIF), one JSON file per trial.

ATIF is Harbor's trajectory format (RFC 0001, "Agent Trajectory Interchange Format",
docs/rfcs/0001-trajectory-format.md in the Harbor repository; this module writes
``ATIF-v1.7``). A run directory holds, per trial, the record (``trials/<id>.json``: reward,
termination, the token-exact trajectory) and, for trials that called the model, the proxy's
transcript (``trials/<id>/proxy.json``: each call's decoded prompt addition and completion,
its tool calls, token counts, segment and weights version). The export joins the two:

- the first model call's prompt (system prompt, tools and instruction, as the chat template
  rendered them) is a ``user`` step;
- each model call is an ``agent`` step: ``message`` is the decoded completion, ``tool_calls``
  the calls the proxy parsed from it, ``metrics`` the call's prompt / completion token counts
  with ``completion_token_ids`` and ``logprobs`` read from the recorded segment (exactly the
  tokens the policy sampled and their behaviour log-probs), ``llm_call_count`` 1;
- what the agent sent next (tool results, reminders, as rendered) is that step's
  ``observation``, tied to its tool call when it made exactly one;
- a call that starts a new segment (the agent rewrote its history) is preceded by a
  ``system`` step carrying the new prompt as its observation, marked with ATIF's context
  management convention (``extra.context_management``: compaction, boundary replace);
- a trial without model calls (model-free agents, a sandbox that never started) is one
  ``system`` step saying so: ATIF wants at least one step.

The reward, termination, group, step, weights version and timings go in the root ``extra``
(ATIF has no reward field); the token totals in ``final_metrics``. ``session_id`` is the
trial id. Fields ATIF requires that slr does not know (an agent's version when its adapter
reports none) are written as ``"unknown"``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slr.contracts import TrialResult
from slr.errors import UsageError
from slr.proxy.server import TRANSCRIPT
from slr.run.directory import RunDir, atomic_write

SCHEMA_VERSION = "ATIF-v1.7"
#: Where a trial's trajectory goes under the output folder: Harbor's trial layout.
TRAJECTORY_PATH = ("agent", "trajectory.json")


def _model_name(run: RunDir) -> str | None:
    try:
        config = tomllib.loads(run.config_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    model = config.get("engine", {}).get("model")
    return str(model) if model else None


def _transcript(run: RunDir, trial_id: str) -> dict[str, Any] | None:
    path = run.path / "trials" / trial_id / TRANSCRIPT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"the transcript {path} is not readable JSON ({exc}); export the other trials "
            f"with --trial, or remove it to export this trial without its model calls"
        ) from None


def _completion(trial: TrialResult, call: dict[str, Any]) -> dict[str, Any]:
    """The call's sampled token ids and log-probs, from its segment in the record."""
    traj = trial.trajectory
    index, start, n = call.get("segment"), call.get("prompt_tokens"), call.get("completion_tokens")
    if traj is None or not isinstance(index, int) or not 0 <= index < len(traj.segments):
        return {}
    if not isinstance(start, int) or not isinstance(n, int) or n <= 0:
        return {}
    seg = traj.segments[index]
    end = start + n
    if end > len(seg.token_ids) or not all(seg.loss_mask[start:end]):
        return {}  # the record and the transcript disagree: leave the ids out, not guess
    return {
        "completion_token_ids": list(seg.token_ids[start:end]),
        "logprobs": list(seg.logprobs[start:end]),
    }


def _agent_step(
    step_id: int, trial: TrialResult, call: dict[str, Any], model: str | None
) -> dict[str, Any]:
    number = call.get("call", step_id)
    calls = [
        {
            "tool_call_id": f"call-{number}-{j}",
            "function_name": str(c.get("name", "")),
            "arguments": c.get("arguments") if isinstance(c.get("arguments"), dict) else {},
        }
        for j, c in enumerate(call.get("tool_calls") or [])
    ]
    metrics: dict[str, Any] = {
        "prompt_tokens": call.get("prompt_tokens"),
        "completion_tokens": call.get("completion_tokens"),
        **_completion(trial, call),
        "extra": {
            k: call[k]
            for k in ("segment", "finish_reason", "weights_version", "weights_versions", "seconds")
            if k in call
        },
    }
    step: dict[str, Any] = {
        "step_id": step_id,
        "source": "agent",
        "message": str(call.get("completion_text", "")),
        "metrics": {k: v for k, v in metrics.items() if v is not None},
        "llm_call_count": 1,
    }
    if model:
        step["model_name"] = model
    if calls:
        step["tool_calls"] = calls
    return step


def trajectory(
    trial: TrialResult, transcript: dict[str, Any] | None, *, model: str | None = None
) -> dict[str, Any]:
    """One trial as an ATIF trajectory (a JSON-ready dict)."""
    steps: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None  # the last agent step: where feedback goes
    calls = (transcript or {}).get("calls") or []
    for n, call in enumerate(calls):
        text = str(call.get("new_prompt_text", ""))
        mode = call.get("mode")
        if n == 0:
            steps.append({"step_id": len(steps) + 1, "source": "user", "message": text})
        elif mode in ("new", "reuse"):
            steps.append(
                {
                    "step_id": len(steps) + 1,
                    "source": "system",
                    "message": "the agent rewrote its history: a new segment starts",
                    "observation": {"results": [{"content": text}]},
                    "extra": {
                        "context_management": {"type": "compaction", "boundary": "replace"},
                        "slr_mode": mode,
                    },
                }
            )
        elif previous is not None and text:
            made = previous.get("tool_calls") or []
            result: dict[str, Any] = {"content": text}
            if len(made) == 1:
                result["source_call_id"] = made[0]["tool_call_id"]
            previous["observation"] = {"results": [result]}
        previous = _agent_step(len(steps) + 1, trial, call, model)
        steps.append(previous)
    if not steps:
        steps.append(
            {
                "step_id": 1,
                "source": "system",
                "message": f"no model calls were recorded for this trial "
                f"(agent {trial.agent or 'unknown'}, {trial.termination.value})",
            }
        )
    agent_steps = [s for s in steps if s["source"] == "agent"]
    extra: dict[str, Any] = {
        "task_id": trial.task_id,
        "termination": trial.termination.value,
        "reward": None if trial.reward is None else trial.reward.value,
        "reward_details": None if trial.reward is None else trial.reward.details,
        "group_id": trial.group_id,
        "step": trial.step,
        "weights_version": trial.weights_version,
        "error": trial.error,
        "timings": trial.timings,
    }
    agent: dict[str, Any] = {
        "name": trial.agent or "unknown",
        "version": trial.agent_version or "unknown",
    }
    if model and agent_steps:  # a model-free agent's trial names no model
        agent["model_name"] = model
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": trial.trial_id,
        "agent": agent,
        "steps": steps,
        "notes": "Exported by slr from a run directory: prompts and completions are the "
        "text the model saw and produced, decoded from the recorded tokens.",
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"].get("prompt_tokens", 0) for s in agent_steps),
            "total_completion_tokens": sum(
                s["metrics"].get("completion_tokens", 0) for s in agent_steps
            ),
            "total_steps": len(steps),
        },
        "extra": {k: v for k, v in extra.items() if v is not None},
    }


def trajectories(
    run_dir: Path, *, trial_ids: set[str] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(trial_id, ATIF trajectory)`` for each recorded trial of a run directory."""
    run = RunDir.open(run_dir)
    model = _model_name(run)
    for trial in run.trials():
        if trial_ids is not None and trial.trial_id not in trial_ids:
            continue
        yield trial.trial_id, trajectory(trial, _transcript(run, trial.trial_id), model=model)


def export(run_dir: Path, out: Path, *, trial_ids: set[str] | None = None) -> list[Path]:
    """Write ``OUT/<trial_id>/agent/trajectory.json`` for each trial; the paths written."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{str(out)!r} is a file; -o takes a folder to write trials into")
    written = []
    for trial_id, doc in trajectories(run_dir, trial_ids=trial_ids):
        path = out.joinpath(trial_id, *TRAJECTORY_PATH)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        written.append(path)
    missing = (trial_ids or set()) - {p.parent.parent.name for p in written}
    if missing:
        raise UsageError(
            f"no trial {', '.join(sorted(missing))} in {run_dir}; `slr status {run_dir}` "
            f"lists its trials"
        )
    return written
