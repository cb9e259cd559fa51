"""Each scaffold, end to end through `slr run`: the real CLI, the real bundle, a real
sandbox (docker and local), the real proxy, the real engine generating every token, the
Harbor verifier, one GRPO step and the weight sync.

The policy is a tiny model taught, in the fixture, to answer in that scaffold's own action
format (a native tool call for the tool-using scaffolds, Terminus-2's JSON, a bash block for
mini-swe-agent) with the action that solves ``examples/tasks/hello-world``, and, for the
tool-using scaffolds, to answer a tool result with a plain "Done." (which ends their run).
Its attention is a one-layer sliding window of eight tokens, so what it says depends only
on the end of the prompt, never on the scaffold's system prompt: taught on short prompts, it
gives the same answer inside a 10k-token Claude Code prompt (taught in seconds, cached on
disk). Generation stays real: the proxy samples it token by token at the run's temperature
(1.0) and records ids, mask and log-probs; the scaffold parses and executes the action.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from e2e_support import HELLO, taught_model
from slr_adapter_claude_code.adapter import ClaudeCode
from slr_adapter_mini_swe_agent.adapter import MiniSweAgent
from slr_adapter_opencode.adapter import OpenCode
from slr_adapter_openhands.adapter import OpenHands
from slr_adapter_terminus.adapter import Terminus

from slr.contracts import TerminationReason
from slr.run import checkpoints
from slr.run.directory import RunDir
from slr.sandboxing.labels import RUN

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
SLR = str(Path(sys.executable).with_name("slr"))


def hermes(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# name -> (adapter class, its [agent] options, what the policy says in the scaffold's format)
CASES = {
    "claude-code": (
        ClaudeCode,
        {"max_turns": 3},
        hermes("Bash", {"command": HELLO, "description": "write hello.txt"}),
    ),
    "opencode": (
        OpenCode,
        {"max_steps": 4},
        hermes("bash", {"command": HELLO, "description": "write hello.txt"}),
    ),
    "openhands": (
        OpenHands,
        {"max_iterations": 3},
        hermes("terminal", {"command": HELLO}),
    ),
    "terminus": (
        Terminus,
        # it asks the model to confirm task_complete once: the second reply does
        {"max_turns": 2},
        json.dumps(
            {
                "analysis": "Empty directory.",
                "plan": "Write hello.txt.",
                "commands": [{"keystrokes": HELLO + "\n", "duration": 0.5}],
                "task_complete": True,
            }
        ),
    ),
    "mini-swe-agent": (
        MiniSweAgent,
        {"step_limit": 3},
        "THOUGHT: write the file, then submit.\n\n```mswea_bash_command\n"
        f"{HELLO} && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
    ),
}

#: One GRPO group of this many trials per run.
GROUP = 2


@pytest.fixture(scope="module", params=sorted(CASES))
def scaffold(request) -> tuple[str, Path]:
    """(agent name, folder of a policy taught that scaffold's action)."""
    name = request.param
    _, _, action = CASES[name]
    # The tool-calling scaffolds end their run on a reply without a tool call.
    after = "Done." if action.startswith("<tool_call>") else None
    return name, taught_model(action, after_result=after)


def toml_value(v: object) -> str:
    return json.dumps(v)  # ints, strings and lists of them are the same in TOML


def write_config(tmp: Path, name: str, model: Path) -> Path:
    options = "\n".join(f"{k} = {toml_value(v)}" for k, v in CASES[name][1].items())
    path = tmp / "run.toml"
    path.write_text(
        f"""
[run]
name = "{name}"
runs_dir = "{tmp / "runs"}"
steps = 1
[tasks]
path = "{ROOT / "examples" / "tasks"}"
include = ["hello-world"]
[rollout]
tasks_per_step = 1
n_per_task = {GROUP}
concurrency = {GROUP}
max_tokens = 160
[agent]
{options}
[engine]
model = "{model}"
"""
    )
    return path


@pytest.mark.parametrize("backend_name", ["docker", "local"])
def test_slr_run_earns_reward_one(scaffold, backend_name, tmp_path, request):
    name, model = scaffold
    docker = request.getfixturevalue("docker_backend") if backend_name == "docker" else None
    cfg = write_config(tmp_path, name, model)
    created: list[dict] = []  # containers created with a run label, watched live
    if docker is not None:
        # subscribed before the run: the daemon keeps only its last 256 events, which
        # other test processes' containers (execs, starts, deaths) overrun within a minute
        events = docker.client.events(
            decode=True, filters={"type": "container", "event": "create", "label": RUN}
        )
        watcher = threading.Thread(target=lambda: created.extend(events), daemon=True)
        watcher.start()
    try:
        res = subprocess.run(
            [SLR, "run", "-c", str(cfg), "--agent", name, "--backend", backend_name],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        if docker is not None:
            time.sleep(1)  # the last event on its way
            events.close()
            watcher.join(10)
    assert res.returncode == 0, res.stderr[-4000:]
    (path,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    run = RunDir.open(path)
    trials = list(run.trials())
    assert len(trials) == GROUP, res.stderr[-4000:]
    version = CASES[name][0]().bundle().version
    for t in trials:
        why = f"{t.error}\n" + "\n".join(f"--- {k}\n{v[-2500:]}" for k, v in t.logs.items())
        assert t.termination == TerminationReason.COMPLETED, why

        # the scaffold's model calls went through the proxy, and were captured exactly
        traj = t.trajectory
        assert traj is not None and traj.num_calls >= 1 and traj.segments, why
        for seg in traj.segments:
            assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs)
        policy = [
            lp
            for seg in traj.segments
            for m, lp in zip(seg.loss_mask, seg.logprobs, strict=True)
            if m
        ]
        assert policy and all(math.isfinite(lp) and lp <= 0.0 for lp in policy), why

        # the action the model chose ran in the sandbox, and the verifier saw it
        assert t.reward is not None and t.reward.value == 1.0, why

        # the record is complete: who ran, on which runtime, with which weights
        assert t.agent == name and t.agent_version == version
        assert t.weights_version == 0 and t.step == 1 and t.group_id is not None
        assert {"start_s", "agent_s", "verifier_s", "total_s"} <= set(t.timings)
        assert any(k.startswith("agent.") and k != "agent.bundle" for k in t.logs), why

    # one step: its metrics line, the weights pushed to the engine as version 1
    (metrics,) = run.metrics()
    assert metrics["step"] == 1 and metrics["weights_version"] == 1
    assert metrics["reward/mean"] == 1.0
    assert checkpoints.latest_checkpoint(run) == checkpoints.checkpoint_dir(run, 1)
    if docker is not None:  # the run removed its sandboxes
        # every trial's container carried the run's label (so the selector below can match)
        mine = [e for e in created if e["Actor"]["Attributes"].get(RUN) == run.id]
        assert len(mine) == len(trials), created
        left = docker.list_sandboxes(**{RUN: run.id})
        assert left == [], [c.name for c in left]
