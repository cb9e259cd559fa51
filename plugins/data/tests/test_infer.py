"""``slr infer`` through the CLI, on the real local backend and the real verifier: the final
diffs as SWE-bench predictions, and the rewarded conversations (a real engine behind the real
proxy) as SFT data; both files load with the ``datasets`` library."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from slr import hookimpl
from slr.agents.model_free import EMPTY_BUNDLE
from slr.contracts import AgentAdapter, AgentOutcome, Bundle
from slr.run.directory import RunDir

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def load_jsonl(path: Path, cache: Path):
    import datasets

    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))


def local_backend(tmp_path: Path) -> list[str]:
    return [
        "--backend",
        "local",
        "--set",
        f"backend.workspace_dir={json.dumps(str(tmp_path / 'ws'))}",
        "--set",
        "backend.isolation='bubblewrap'",
    ]


def infer(cli, *args: str) -> dict:
    result = CliRunner().invoke(cli, ["infer", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{") :])


@pytest.mark.timeout(120)
def test_oracle_diffs_become_predictions_that_apply_to_the_base(tmp_path, slr_cli):
    out = tmp_path / "run"
    doc = infer(
        slr_cli,
        "--agent",
        "oracle",
        *local_backend(tmp_path),
        "-p",
        str(EXAMPLES),
        "--set",
        'tasks.include=["fix-median", "hello-world"]',
        "--output",
        str(out),
    )
    assert doc["exported"]["predictions"] == {"predictions.jsonl": 2}
    rows = {r["instance_id"]: r for r in load_jsonl(out / "predictions.jsonl", tmp_path / "hf")}
    assert set(rows) == {"fix-median", "hello-world"}
    assert all(r["model_name_or_path"] == "oracle" for r in rows.values())
    # hello-world's /app is no repository: nothing to diff
    assert rows["hello-world"]["model_patch"] == ""
    patch = rows["fix-median"]["model_patch"]
    assert "+++ b/stats/core.py" in patch and "+    mid = len(values) // 2" in patch
    assert "__pycache__" not in patch  # the solution ran the tests; byte-code is left out
    base = tmp_path / "base"
    shutil.copytree(EXAMPLES / "fix-median" / "environment" / "repo", base)
    (tmp_path / "model.patch").write_text(patch)
    subprocess.run(["git", "apply", "--check", str(tmp_path / "model.patch")], cwd=base, check=True)
    # the diff is the record's, so the run directory alone re-makes the file
    assert RunDir.open(out).trial("fix-median-0").diff == patch


class AsksThenWrites(AgentAdapter):
    """Stand-in for a scaffold (the real CLIs have their own tests): asks the policy once from
    inside the sandbox through the proxy, then solves hello-world on every other trial."""

    protocol = "openai"

    def __init__(self) -> None:
        self.runs = 0

    def bundle(self) -> Bundle:
        return Bundle(path=EMPTY_BUNDLE, version="test")

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        solve, self.runs = self.runs % 2 == 0, self.runs + 1
        body = json.dumps(
            {
                "model": endpoint.model,
                "messages": [{"role": "user", "content": instruction}],
                "max_tokens": 6,
            }
        )
        res = await sandbox.exec(
            ["python3", "-c", ASK, endpoint.base_url, body, endpoint.api_key], timeout_s=timeout_s
        )
        if solve:
            await sandbox.exec("echo hello > /app/hello.txt")
        return AgentOutcome(exit_code=res.exit_code, logs={"reply": res.stdout, "err": res.stderr})


ASK = """
import sys, urllib.request as u
req = u.Request(sys.argv[1] + "/chat/completions", data=sys.argv[2].encode(),
                headers={"Authorization": "Bearer " + sys.argv[3],
                         "Content-Type": "application/json"})
print(u.urlopen(req, timeout=60).read().decode())
"""


class TestAgent:
    @hookimpl
    def register_agents(self, register):
        register("asks-then-writes", AsksThenWrites)


@pytest.mark.timeout(180)
def test_sft_keeps_only_rewarded_conversations(tmp_path, slr_plugins, slr_cli, tiny_model_dir):
    slr_plugins.register(TestAgent(), name="asks-then-writes")
    out = tmp_path / "run"
    doc = infer(
        slr_cli,
        "--agent",
        "asks-then-writes",
        *local_backend(tmp_path),
        "--engine",
        "hf",
        "--set",
        f"engine.model={json.dumps(str(tiny_model_dir))}",
        "--set",
        "rollout.max_tokens=6",
        "-p",
        str(EXAMPLES),
        "--set",
        'tasks.include=["hello-world"]',
        "-k",
        "2",
        "-j",
        "1",
        "--sft",
        "--model-name",
        "tiny/policy",
        "--output",
        str(out),
    )
    run = RunDir.open(out)
    rewards = {t.trial_id: t.reward.value for t in run.trials() if t.reward is not None}
    assert sorted(rewards.values()) == [0.0, 1.0]
    assert doc["exported"]["sft"] == {"kept": 1, "not_rewarded": 1, "no_model_calls": 0}
    assert doc["exported"]["predictions"] == {"predictions-0.jsonl": 1, "predictions-1.jsonl": 1}
    pred = load_jsonl(out / "predictions-1.jsonl", tmp_path / "hf")[0]
    assert pred["model_name_or_path"] == "tiny/policy" and pred["instance_id"] == "hello-world"

    sft = load_jsonl(out / "sft.jsonl", tmp_path / "hf")
    assert len(sft) == 1
    row = sft[0]
    (winner,) = (i for i, r in rewards.items() if r == 1.0)
    assert row["trial_id"] == winner and row["reward"] == 1.0 and row["task_id"] == "hello-world"
    user, assistant = row["messages"]
    assert user["role"] == "user" and "hello.txt" in user["content"]
    # the assistant turn is exactly what the agent was answered
    reply = json.loads(run.trial(winner).logs["agent.reply"])
    assert assistant["role"] == "assistant"
    assert assistant["content"] == reply["choices"][0]["message"]["content"]
    assert json.loads(row["tools"]) == []


def test_sft_with_an_agent_that_calls_no_model_is_refused(tmp_path, slr_cli):
    result = CliRunner().invoke(
        slr_cli, ["infer", "--agent", "oracle", "-p", str(EXAMPLES), "--sft"], catch_exceptions=True
    )
    assert result.exit_code != 0
    assert "calls no model" in str(result.exception) + result.output
