"""`slr export atif`: trials of a real run directory as Harbor's trajectory format (ATIF),
checked against the published schema (atif_schema, pydantic) and Harbor's own validator."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest
from atif_schema import Trajectory
from click.testing import CliRunner
from slr_engine_hf.engine import HfEngine

from slr.config import load_config
from slr.contracts import Reward, Segment, TerminationReason, TrialResult
from slr.contracts import Trajectory as Recorded
from slr.errors import UsageError
from slr.export.atif import SCHEMA_VERSION, trajectory
from slr.plugins import get_plugin_manager
from slr.rollout.recorder import TrialRecorder
from slr.run.directory import RunDir
from slr_cli.main import cli
from slr_testkit import tiny


@pytest.fixture(scope="module")
def served_run(tmp_path_factory) -> Path:
    """A run directory of `slr serve`'s kind: one session, three real model calls through
    the proxy (a first prompt, a follow-up that extends it, a rewritten history)."""
    base = tmp_path_factory.mktemp("atif")
    model, tok = tiny.tiny_model(hidden=32, layers=1)
    config = load_config(
        data={"rollout": {"max_tokens": 6}, "engine": {"name": "hf", "model": "Org/Tiny"}},
        plugins=get_plugin_manager(),
        only_plugins=("engine",),
    )
    run = RunDir.create(base / "runs", "serve", config.to_toml())

    async def go():
        engine = HfEngine.from_model(model, tok)
        async with TrialRecorder(
            run, plugins=get_plugin_manager(), config=config, engine=engine
        ) as s:
            opened = s.open_session("session-0")
            client = openai.AsyncOpenAI(
                base_url=opened.openai_base_url, api_key=opened.token, max_retries=0
            )
            history: list[Any] = [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "List the files."},
            ]
            first = await client.chat.completions.create(model="policy", messages=history)
            history += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "README.md setup.py"},
            ]
            await client.chat.completions.create(model="policy", messages=history)
            # compaction: the agent replaces its history with a summary
            await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "Summary: two files."}]
            )
            await s.close_session(opened)

    asyncio.run(go())
    return run.path


def export(run_path: Path, out: Path, *args: str) -> list[Path]:
    res = CliRunner().invoke(cli, ["export", "atif", str(run_path), "-o", str(out), *args])
    assert res.exit_code == 0, res.output
    return sorted(out.glob("*/agent/trajectory.json"))


def test_a_served_session_exports_as_a_valid_atif_trajectory(served_run, tmp_path):
    (path,) = export(served_run, tmp_path / "out")
    doc = json.loads(path.read_text())
    parsed = Trajectory.model_validate(doc)  # the published schema, unknown fields refused
    assert path.parent.parent.name == "session-0" == parsed.session_id
    assert parsed.schema_version == SCHEMA_VERSION
    assert parsed.agent.model_name == "Org/Tiny"
    sources = [s.source for s in parsed.steps]
    assert sources == ["user", "agent", "agent", "system", "agent"]
    first, second = parsed.steps[1], parsed.steps[2]
    # the follow-up message is the first call's observation, as rendered for the model
    assert first.observation is not None
    assert "README.md setup.py" in str(first.observation.results[0].content)
    assert "List the files." in str(parsed.steps[0].message)
    compaction = parsed.steps[3]
    assert compaction.extra == {
        "context_management": {"type": "compaction", "boundary": "replace"},
        "slr_mode": "new",
    }
    # the token ids and log-probs are the recorded ones, call by call
    record = RunDir.open(served_run).trial("session-0")
    assert record.trajectory is not None
    seg0, seg1 = record.trajectory.segments
    policy = [t for t, m in zip(seg0.token_ids, seg0.loss_mask, strict=True) if m]
    assert first.metrics is not None and second.metrics is not None
    assert (first.metrics.completion_token_ids or []) + (
        second.metrics.completion_token_ids or []
    ) == policy
    last = parsed.steps[4].metrics
    assert last is not None and last.logprobs == [
        lp for lp, m in zip(seg1.logprobs, seg1.loss_mask, strict=True) if m
    ]
    assert parsed.final_metrics is not None
    assert parsed.final_metrics.total_completion_tokens == sum(seg0.loss_mask) + sum(seg1.loss_mask)


def _record(**kw) -> TrialResult:
    seg = Segment(token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -0.5, -0.25])
    fields = {
        "trial_id": "t1",
        "task_id": "hello",
        "termination": TerminationReason.COMPLETED,
        "reward": Reward(value=1.0),
        "agent": "opencode",
        "trajectory": Recorded(session_id="t1", segments=[seg]),
    }
    return TrialResult(**{**fields, **kw})


def test_a_tool_call_and_its_result_are_tied_by_id():
    calls = [
        {"call": 1, "segment": 0, "mode": "new", "prompt_tokens": 2, "completion_tokens": 2,
         "new_prompt_text": "do it", "completion_text": "<tool_call>...</tool_call>",
         "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]},
        {"call": 2, "segment": 0, "mode": "extend", "prompt_tokens": 6, "completion_tokens": 0,
         "new_prompt_text": "README.md", "completion_text": "", "tool_calls": []},
    ]  # fmt: skip
    doc = trajectory(_record(), {"calls": calls})
    parsed = Trajectory.model_validate(doc)
    step = parsed.steps[1]
    assert step.tool_calls is not None and step.tool_calls[0].arguments == {"cmd": "ls"}
    assert step.observation is not None
    assert step.observation.results[0].source_call_id == step.tool_calls[0].tool_call_id
    assert step.metrics is not None and step.metrics.logprobs == [-0.5, -0.25]
    assert doc["extra"]["reward"] == 1.0 and doc["extra"]["termination"] == "completed"
    assert doc["agent"] == {"name": "opencode", "version": "unknown"}


def test_a_trial_without_model_calls_is_still_a_trajectory():
    doc = trajectory(_record(trajectory=None, agent="oracle"), None, model="Org/Tiny")
    parsed = Trajectory.model_validate(doc)
    assert [s.source for s in parsed.steps] == ["system"]
    assert parsed.agent.model_name is None  # nothing was asked of the model


def test_a_record_and_transcript_that_disagree_leave_the_ids_out():
    calls = [{"call": 1, "segment": 0, "mode": "new", "prompt_tokens": 1,
              "completion_tokens": 2, "new_prompt_text": "x", "completion_text": "y"}]  # fmt: skip
    step = Trajectory.model_validate(trajectory(_record(), {"calls": calls})).steps[1]
    assert step.metrics is not None and step.metrics.completion_token_ids is None


def test_bad_arguments_get_one_line_errors(served_run, tmp_path):
    # raised as UsageError: `slr`'s entry point prints the message and exits 2
    res = CliRunner().invoke(cli, ["export", "atif", str(tmp_path), "-o", str(tmp_path / "o")])
    assert isinstance(res.exception, UsageError) and "not a run directory" in str(res.exception)
    res = CliRunner().invoke(
        cli, ["export", "atif", str(served_run), "-o", str(tmp_path / "o"), "--trial", "nope"]
    )
    assert isinstance(res.exception, UsageError) and "no trial nope" in str(res.exception)
    (tmp_path / "file").write_text("")
    res = CliRunner().invoke(cli, ["export", "atif", str(served_run), "-o", str(tmp_path / "file")])
    assert isinstance(res.exception, UsageError) and "is a file" in str(res.exception)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_harbors_own_validator_accepts_the_export(served_run, tmp_path):
    """Harbor's TrajectoryValidator, from the terminus adapter's bundle (Harbor itself needs
    Python >= 3.12, so it runs in that bundle's interpreter; built once, then cached)."""
    from slr_adapter_terminus.adapter import Terminus

    from slr.agents.bundle_recipes import python_bin, python_env

    adapter = Terminus()
    root = adapter.bundle().path
    python = python_bin(str(root), adapter.config.python)
    paths = export(served_run, tmp_path / "out")
    paths.append(tmp_path / "synthetic.json")
    paths[-1].write_text(json.dumps(trajectory(_record(), None)))

    def harbor_validates(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [python, "-m", "harbor.utils.trajectory_validator", str(path)],
            capture_output=True, text=True, timeout=120, env=python_env(root),
        )  # fmt: skip

    for path in paths:
        res = harbor_validates(path)
        assert res.returncode == 0, res.stdout + res.stderr
    # the validator is live: a step numbered out of order is refused
    bad = json.loads(paths[0].read_text())
    bad["steps"][0]["step_id"] = 7
    paths[0].write_text(json.dumps(bad))
    res = harbor_validates(paths[0])
    assert res.returncode != 0 and "step_id" in res.stdout + res.stderr
