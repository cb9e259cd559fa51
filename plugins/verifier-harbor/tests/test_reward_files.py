"""Reading Harbor reward files: a number, or an error that says what is wrong. Never 0."""

from __future__ import annotations

import pytest
from slr_verifier_harbor.verifier import _read_reward

from slr.contracts import ExecResult, VerifierError

RES = ExecResult(exit_code=1, stderr="boom")


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("reward.txt", "1\n", 1.0),
        ("reward.txt", " 0.25 ", 0.25),
        ("reward.json", '{"reward": 0.5, "tests": 4}', 0.5),
        ("reward.json", '{"pass_rate": 0.75}', 0.75),
        ("reward.json", "1", 1.0),
    ],
)
def test_rewards_read(tmp_path, name, text, value):
    (tmp_path / name).write_text(text)
    assert _read_reward(tmp_path, "t", RES)[0] == value


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("reward.txt", "passed", "holds 'passed', not a number"),
        ("reward.txt", "nan", "not a finite number"),
        ("reward.json", "{", "not JSON"),
        ("reward.json", '{"a": 1, "b": 0}', "no 'reward' key"),
        ("reward.json", '{"reward": true}', "no 'reward' key"),
        ("reward.json", "[1]", "not an object"),
    ],
)
def test_bad_rewards_are_errors(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(VerifierError, match=message):
        _read_reward(tmp_path, "t", RES)


def test_no_reward_file_is_an_error_with_the_tests_stderr(tmp_path):
    with pytest.raises(VerifierError, match=r"exited 1 without writing.*boom"):
        _read_reward(tmp_path, "t", RES)


def test_reward_txt_wins_over_reward_json(tmp_path):
    (tmp_path / "reward.txt").write_text("0")
    (tmp_path / "reward.json").write_text('{"reward": 1}')
    assert _read_reward(tmp_path, "t", RES)[0] == 0.0
