"""Per-trial cost accounting (slr.rollout.costs): fields present, phases that add up, old records."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend
from slr_verifier_harbor.verifier import HarborVerifier

from slr.agents.model_free import OracleAgent
from slr.contracts import TrialCosts, TrialResult
from slr.contracts.serialize import from_dict, to_dict
from slr.rollout.costs import PHASES, CostMeter, ModelClock, cost_means, cost_means_by_step
from slr.rollout.trial import StandInSessions, run_trial
from slr.sandboxing.cpu import SandboxCgroup
from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_record_without_costs_still_loads():
    old = {"trial_id": "t", "task_id": "x", "termination": "completed", "timings": {"total_s": 1}}
    record = from_dict(old, TrialResult)
    assert record.costs is None and cost_means([record]) == {}
    costs = TrialCosts(wall_s={"model": 1.0}, cpu_s={"tools": 0.5}, pool_start_s=0.2)
    again = from_dict(to_dict(TrialResult(**{**old, "costs": costs})), TrialResult)
    assert again.costs == costs


def test_meter_splits_the_agent_phase_at_the_first_call():
    readings = iter([1.0, 1.5, 4.0, 4.25])  # sandbox CPU at: agent, first call, verifier, cleanup
    meter = CostMeter(lambda: next(readings))
    clock = ModelClock()
    clock.on_first_call = meter.first_call
    meter.mark("agent")
    clock.call_arrived()
    started = clock.engine_started()
    time.sleep(0.05)  # the "engine" is busy: time passes on the one clock the meter reads
    clock.engine_ended(started)
    meter.mark("verifier")
    meter.mark("cleanup")
    meter.mark("end", read_cpu=False)
    c = meter.costs(clock, pool_start_s=None)
    assert list(c.wall_s) == list(PHASES)
    total = meter.marks["end"] - meter.marks["sandbox_start"]
    assert sum(c.wall_s.values()) == pytest.approx(total, abs=1e-3)
    assert c.wall_s["model"] >= 0.05 and c.model_calls == 1
    assert c.cpu_s == {"sandbox_start": 1.0, "agent_startup": 0.5, "tools": 2.5, "verifier": 0.25}


def test_a_real_trial_carries_consistent_costs(tmp_path):
    backend = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(tmp_path / "ws"),
            cache_dir=str(tmp_path / "cache"),
        )
    )
    task_dir = tmp_path / "task"
    shutil.copytree(EXAMPLES / "hello-world", task_dir)
    # the verifier burns CPU on purpose, so its share is visibly measured
    test_sh = task_dir / "tests" / "test.sh"
    test_sh.write_text(
        test_sh.read_text().replace(
            "#!/bin/bash\n", "#!/bin/bash\ni=0; while [ $i -lt 100000 ]; do i=$((i+1)); done\n", 1
        )
    )
    result = asyncio.run(
        run_trial(
            load_task(task_dir),
            backend=backend,
            agent=OracleAgent(),
            verifier=HarborVerifier(),
            session_factory=StandInSessions(),
            step=3,
        )
    )
    assert result.reward is not None and result.reward.value == 1.0, result.error
    costs = result.costs
    assert costs is not None and set(costs.wall_s) == set(PHASES)
    assert sum(costs.wall_s.values()) == pytest.approx(result.timings["total_s"], abs=0.01)
    assert costs.wall_s["model"] == 0 and costs.model_calls == 0
    assert costs.pool_start_s is None
    probe = SandboxCgroup.create(f"probe-{tmp_path.name}")
    if probe is None:  # no writable cgroup hierarchy here: the record says so
        assert costs.cpu_s == {} and costs.cpu_note
    else:
        probe.remove()
        assert costs.cpu_s["verifier"] > 0.05, costs
        assert costs.cpu_s["sandbox_start"] > 0
    means = cost_means_by_step([result])[3]
    assert means["cost/wall/verifier_s"] == costs.wall_s["verifier"]
