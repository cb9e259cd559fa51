"""Trial records on disk: msgspec writes and reads them; every earlier file still loads the same.

``old_file`` is what earlier versions wrote (cattrs, then ``json.dumps(..., sort_keys=True)``);
``fixtures/trial-record-v1.json`` is such a file, committed as it came out of them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cattrs.errors import ClassValidationError

from slr.contracts import Reward, Segment, Trajectory, TrialCosts, TrialResult, from_dict, to_dict
from slr.contracts.serialize import decode, encode
from slr.run.directory import RunDir

FIXTURE = Path(__file__).parent / "fixtures" / "trial-record-v1.json"


def _trial(logprobs=(0.0, -0.5, -1.25), **kw) -> TrialResult:
    return TrialResult(
        trial_id="t1",
        task_id="hello",
        termination="completed",
        reward=Reward(value=1.0, details={"tests": 3, "names": ["a", "b"]}),
        group_id="g",
        step=2,
        agent="oracle",
        weights_version=3,
        timings={"total_s": 1.5},
        trajectory=Trajectory(
            session_id="s",
            segments=[
                Segment(
                    token_ids=[1, 2, 3],
                    loss_mask=[0, 1, 1],
                    logprobs=list(logprobs),
                    routed_experts=[[[0, 1]], [[2, 3]], [[1, 2]]],
                    weights_versions=[3, 3, 3],
                )
            ],
            num_calls=1,
        ),
        logs={"agent": "ok\n"},
        costs=TrialCosts(wall_s={"agent": 1.0}, cpu_s={}, model_calls=1),
        **kw,
    )


def old_file(trial: TrialResult) -> bytes:
    """Exactly what ``RunDir.write_trial`` wrote before msgspec."""
    return json.dumps(to_dict(trial), sort_keys=True).encode()


def old_read(data: bytes) -> TrialResult:
    return from_dict(json.loads(data), TrialResult)


def test_new_records_round_trip():
    t = _trial()
    assert decode(encode(t), TrialResult) == t


def test_records_written_by_earlier_versions_load_exactly_as_before():
    t = _trial()
    assert decode(old_file(t), TrialResult) == old_read(old_file(t)) == t
    committed = FIXTURE.read_bytes()
    assert decode(committed, TrialResult) == old_read(committed)
    # a record from before cost accounting, with a key this version does not know
    legacy = json.loads(committed)
    del legacy["costs"]
    legacy["retired_field"] = 1
    data = json.dumps(legacy).encode()
    assert decode(data, TrialResult) == old_read(data)
    assert decode(data, TrialResult).costs is None


def test_non_finite_log_probabilities_survive_a_round_trip():
    t = _trial(logprobs=(0.0, float("-inf"), float("nan")), error=None)
    back = decode(encode(t), TrialResult)
    lp = back.trajectory.segments[0].logprobs
    assert lp[0] == 0.0 and lp[1] == float("-inf") and math.isnan(lp[2])
    # and what earlier versions wrote for such a record loads too
    lp = decode(old_file(t), TrialResult).trajectory.segments[0].logprobs
    assert lp[1] == float("-inf") and math.isnan(lp[2])


def test_a_record_breaking_an_invariant_is_refused_on_load():
    data = json.loads(old_file(_trial()))
    data["trajectory"]["segments"][0]["loss_mask"] = [0, 1]
    bad = json.dumps(data).encode()
    with pytest.raises(ClassValidationError) as new:
        decode(bad, TrialResult)
    with pytest.raises(ClassValidationError) as old:
        old_read(bad)
    assert str(new.value) == str(old.value)


def test_the_run_dir_reads_old_and_new_records_side_by_side(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    (run.path / "trials" / "old.json").write_bytes(FIXTURE.read_bytes())
    run.write_trial(_trial())
    got = {t.trial_id: t for t in RunDir.open(run.path).trials()}
    assert got["t1"] == _trial()
    assert got[old_read(FIXTURE.read_bytes()).trial_id] == old_read(FIXTURE.read_bytes())
