"""The soak harness, CI-sized: a full ``slr run`` (async, two engine replicas and the trainer
as Ray actors, the local backend) in which one engine replica and one running sandbox are
SIGKILLed mid-run; counted from the run directory afterwards: nothing lost, nothing counted
twice, no step trained on an infrastructure failure, and the run finished.

``bench/soak.py`` is the long version (every fault kind, minutes); this is its harness at
the smallest size that still has the faults land on trials in flight. The model-free
``oracle`` agent keeps it cheap; the engine replicas still serve the proxy's sessions'
neighbours and take the weight updates, so a killed replica is one the run must survive.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(300)]


def _soak():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("soak", BENCH / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_killing_an_engine_replica_and_a_sandbox_mid_run_loses_nothing():
    soak = _soak()
    args = soak.parser().parse_args(
        [
            "--agent", "oracle", "--trials", "48", "--concurrency", "4",
            "--duration", "2", "--n-faults", "2", "--faults", "engine,sandbox", "--in-order",
            "--grace", "180",
        ]
    )  # fmt: skip
    args.faults = args.faults.split(",")
    out = soak.run_soak(args)
    # the replica first (one always exists while the run lives), then a sandbox (it waits for
    # a command to run); 48 trials leave the run ~12 s of trials after the first one for both
    assert out["missed_faults"] == [], out["fault_log"]
    assert out["faults"].get("engine", {}).get("injected") == 1, out
    assert out["faults"].get("sandbox", {}).get("injected") == 1, out
    assert out["finished"], out["crash_tails"]
    assert out["crashes"] == 0, out["crash_tails"]
    assert out["lost"] == 0
    assert out["counted_twice"] == 0
    assert out["steps_trained_on_infra"] == 0
    assert out["corrupt_records"] == 0
    # a killed sandbox's trial is an infrastructure failure, never a scored one (the kill may
    # also land as a command ends, when nothing fails: the local backend's own test,
    # test_local_killed_from_outside.py, pins the sandbox_error deterministically)
    assert out["other_failures"] == 0, out["terminations"]
