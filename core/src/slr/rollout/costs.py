"""Per-trial cost accounting: where a trial's wall time and sandbox CPU went, phase by phase.

In RL for agents the policy's tokens are often the cheap part; a trial's fixed costs
(starting a sandbox, starting the scaffold, running its tools, the verifier) are paid once
per trial, tens of thousands of times a run. This module is the one definition of the split
every trial record carries (``TrialResult.costs``), that ``slr status`` and the step metrics
show, and that ``bench/trial_overhead.py`` compares:

- ``sandbox_start``: trial start to the agent phase (prepare, bundle, sandbox start, git
  squash, opening the proxy session);
- ``agent_startup``: agent phase start to the scaffold's first model call (the whole agent
  phase when it never calls the model);
- ``model``: time the proxy spent waiting on the engine (``ModelClock``);
- ``tools``: the rest of the agent phase (tool execution, the scaffold's own work);
- ``verifier``: ending the agent's processes, restoring history, the tests;
- ``cleanup``: closing the session, stopping the sandbox.

Wall times come from one monotonic clock and sum to the trial's ``total_s``. CPU is read
from the sandbox (``slr.contracts.MeteredSandbox.cpu_s``: cumulative, so phases are differences) at the
phase boundaries and at the first model call; ``cleanup`` CPU is not measured (the sandbox
is being destroyed), nor is the engine's share of ``model`` (the engine serves many trials
at once in one process).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping

from slr.contracts.records import TrialCosts, TrialResult
from slr.contracts.sandbox import MeteredSandbox

PHASES = ("sandbox_start", "agent_startup", "model", "tools", "verifier", "cleanup")
"""The phases of a trial, in order; ``TrialCosts.wall_s`` has each."""

CPU_NOT_MEASURED = "cleanup and the engine's share of model time are not measured"


def sandbox_cpu_s(sandbox: object) -> float | None:
    """The sandbox's cumulative CPU seconds, or None (not metered, or the reading failed)."""
    if not isinstance(sandbox, MeteredSandbox):
        return None
    try:
        value = sandbox.cpu_s()
    except Exception:  # a meter must never fail a trial
        return None
    return None if value is None else float(value)


class ModelClock:
    """One session's model time: when its first call arrived, and the time spent waiting
    on the engine over all its calls. The proxy drives it; the trial runner reads it.

    ``on_first_call`` (set by the trial runner) runs once, synchronously, when the first call
    arrives, on whatever thread serves the proxy.
    """

    def __init__(self) -> None:
        self.first_call_at: float | None = None
        self.model_s = 0.0
        self.calls = 0
        self.on_first_call: Callable[[], None] | None = None

    def call_arrived(self) -> None:
        if self.first_call_at is None:
            self.first_call_at = time.monotonic()
            if self.on_first_call is not None:
                self.on_first_call()

    def engine_started(self) -> float:
        return time.monotonic()

    def engine_ended(self, started: float) -> None:
        self.model_s += time.monotonic() - started
        self.calls += 1


class CostMeter:
    """The trial runner's marks: phase boundaries (monotonic) and CPU readings there."""

    def __init__(self, sandbox_cpu: Callable[[], float | None]) -> None:
        self._cpu = sandbox_cpu
        self.marks: dict[str, float] = {"sandbox_start": time.monotonic()}
        self.cpu: dict[str, float | None] = {}

    def mark(self, phase: str, *, read_cpu: bool = True) -> None:
        """``phase`` starts now (``agent``, ``verifier``, ``cleanup`` or ``end``)."""
        self.marks[phase] = time.monotonic()
        if read_cpu:
            self.cpu[phase] = self._cpu()

    def first_call(self) -> None:
        self.cpu["first_call"] = self._cpu()

    def costs(self, clock: ModelClock | None, *, pool_start_s: float | None) -> TrialCosts:
        m = self.marks
        order = [p for p in ("sandbox_start", "agent", "verifier", "cleanup", "end") if p in m]
        span = {p: m[q] - m[p] for p, q in itertools.pairwise(order)}
        agent = span.get("agent", 0.0)
        first = clock.first_call_at if clock is not None else None
        startup = agent if first is None else min(max(first - m["agent"], 0.0), agent)
        model = min(clock.model_s if clock is not None else 0.0, agent - startup)
        wall = {
            "sandbox_start": span.get("sandbox_start", 0.0),
            "agent_startup": startup,
            "model": model,
            "tools": agent - startup - model,
            "verifier": span.get("verifier", 0.0),
            "cleanup": span.get("cleanup", 0.0),
        }
        cpu: dict[str, float] = {}
        c = self.cpu
        at_agent, at_first, at_verifier = c.get("agent"), c.get("first_call"), c.get("verifier")
        if at_agent is not None:
            cpu["sandbox_start"] = at_agent
        if at_agent is not None and at_verifier is not None:
            split = at_first if at_first is not None and first is not None else at_verifier
            cpu["agent_startup"] = max(split - at_agent, 0.0)
            cpu["tools"] = max(at_verifier - split, 0.0)
        if at_verifier is not None and c.get("cleanup") is not None:
            cpu["verifier"] = max(c["cleanup"] - at_verifier, 0.0)  # type: ignore[operator]
        if at_agent is None and "agent" in m:
            note = "this sandbox backend cannot measure CPU"
        else:
            note = CPU_NOT_MEASURED
        return TrialCosts(
            wall_s={k: round(v, 4) for k, v in wall.items()},
            cpu_s={k: round(v, 4) for k, v in cpu.items()},
            cpu_note=note,
            model_calls=clock.calls if clock is not None else 0,
            pool_start_s=None if pool_start_s is None else round(pool_start_s, 4),
        )


def fixed_wall_s(costs: TrialCosts) -> float:
    """Everything but model time: what a trial costs whatever the policy does."""
    return sum(v for k, v in costs.wall_s.items() if k != "model")


def cost_means(trials: Iterable[TrialResult]) -> dict[str, float]:
    """Mean per trial of each phase's wall time and CPU, over the trials that carry costs.

    Keys: ``cost/wall/<phase>_s``, ``cost/cpu/<phase>_s`` (over the trials that measured
    that phase), ``cost/fixed_wall_s``, ``cost/pooled_fraction``, ``cost/trials``. Empty
    when no trial has costs (records written before cost accounting).
    """
    costs = [t.costs for t in trials if t.costs is not None]
    if not costs:
        return {}
    out: dict[str, float] = {"cost/trials": float(len(costs))}
    for phase in PHASES:
        out[f"cost/wall/{phase}_s"] = _mean(c.wall_s.get(phase, 0.0) for c in costs)
    for phase in PHASES:
        measured = [c.cpu_s[phase] for c in costs if phase in c.cpu_s]
        if measured:
            out[f"cost/cpu/{phase}_s"] = _mean(measured)
    out["cost/fixed_wall_s"] = _mean(fixed_wall_s(c) for c in costs)
    out["cost/pooled_fraction"] = _mean(float(c.pool_start_s is not None) for c in costs)
    return out


def cost_means_by_step(trials: Iterable[TrialResult]) -> dict[int | None, dict[str, float]]:
    """``cost_means`` per step (``None``: trials outside any step, such as eval's)."""
    by_step: dict[int | None, list[TrialResult]] = {}
    for t in trials:
        by_step.setdefault(t.step, []).append(t)
    out = {step: cost_means(ts) for step, ts in by_step.items()}
    return {k: v for k, v in out.items() if v}


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return round(sum(vals) / len(vals), 4) if vals else 0.0


def phase_table(means: Mapping[str, float]) -> list[tuple[str, float, float | None]]:
    """``(phase, wall, cpu or None)`` rows from ``cost_means``' keys, in phase order."""
    return [(p, means.get(f"cost/wall/{p}_s", 0.0), means.get(f"cost/cpu/{p}_s")) for p in PHASES]
