"""Each scaffold, end to end: real bundle, real sandbox (docker and local), the real proxy,
the real engine generating every token, the Harbor verifier, the trial runner.

The policy is a tiny model taught, in the fixture, to answer in that scaffold's own action
format (a native tool call for the tool-using scaffolds, Terminus-2's JSON, a bash block for
mini-swe-agent) with the action that solves ``examples/tasks/hello-world``. Its attention
is a one-layer sliding window of five tokens, so what it says depends only on the end of
the prompt (``<|im_end|>\\n<|im_start|>assistant\\n``), never on the scaffold's system
prompt: taught on short prompts, it gives the same answer inside a 10k-token Claude Code
prompt (taught once, then cached on disk).
Generation stays real: the proxy samples it token by token and records ids, mask and
log-probs. Whatever the scaffold does after the action (repeat it, stop), the file stays,
and the verifier gives reward 1.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from e2e_support import HELLO, taught_engine
from slr_adapter_claude_code.adapter import ClaudeCode, ClaudeCodeConfig
from slr_adapter_mini_swe_agent.adapter import MiniSweAgent
from slr_adapter_opencode.adapter import OpenCode, OpenCodeConfig
from slr_adapter_openhands.adapter import OpenHands, OpenHandsConfig
from slr_adapter_terminus.adapter import Terminus, TerminusConfig

from slr.config import ProxySection
from slr.contracts import SamplingParams, TerminationReason
from slr.plugins import get_plugin_manager
from slr.proxy import Proxy, ProxySessions, ProxyThread
from slr.trial import run_trial

pytestmark = [pytest.mark.slow, pytest.mark.docker]

MODEL = "policy"


def hermes(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# name -> (adapter, what the policy says: the scaffold's own action format)
CASES = {
    "claude-code": (
        lambda: ClaudeCode(ClaudeCodeConfig(max_turns=2)),
        hermes("Bash", {"command": HELLO, "description": "write hello.txt"}),
    ),
    "opencode": (
        lambda: OpenCode(OpenCodeConfig(max_steps=2)),
        hermes("bash", {"command": HELLO, "description": "write hello.txt"}),
    ),
    "openhands": (
        lambda: OpenHands(OpenHandsConfig(max_iterations=2)),
        hermes("terminal", {"command": HELLO}),
    ),
    "terminus": (
        lambda: Terminus(TerminusConfig(max_turns=2)),
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
        "THOUGHT: write the file, then submit.\n\n```mswea_bash_command\n"
        f"{HELLO} && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
    ),
}


# The tiny taught policy does not reproduce these actions reliably yet: opencode, openhands
# and terminus get ``<tool_call>`` and stop; mini-swe-agent's policy, taught with the
# current tiny_model (untied head), garbles the submit line. The trials run and are
# captured, but score 0. Expected failures, named here and in docs/agents.md, until the
# taught policy is fixed (a wider model or more steps in e2e_support.taught_engine).
NOT_YET_LEARNED = {"opencode", "openhands", "terminus", "mini-swe-agent"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(
            name,
            # not run: teaching each policy costs minutes of CI for a known 0
            marks=pytest.mark.xfail(
                run=False, reason="the tiny taught policy garbles this action yet"
            ),
        )
        if name in NOT_YET_LEARNED
        else name
        for name in sorted(CASES)
    ],
)
def scaffold(request):
    """(name, adapter, proxy) with a policy taught this scaffold's action; one per module."""
    name = request.param
    make, action = CASES[name]
    engine = taught_engine(action)
    proxy = Proxy(
        engine,
        ProxySection(model_names=[MODEL]),
        sampling=SamplingParams(max_tokens=160, temperature=1.0),
    )
    with ProxyThread(proxy) as running:
        yield name, make(), running
    asyncio.run(engine.close())


def test_trial_end_to_end(scaffold, backend_name, request, hello_task):
    name, adapter, proxy = scaffold
    backend = request.getfixturevalue(f"{backend_name}_backend")
    verifier = get_plugin_manager().get("verifier", "harbor").load()()
    result = asyncio.run(
        run_trial(
            hello_task,
            backend=backend,
            agent=adapter,
            verifier=verifier,
            session_factory=ProxySessions(proxy, protocol=adapter.protocol, model=MODEL),
            agent_name=name,
            agent_timeout_s=300,
        )
    )
    why = f"{result.error}\n" + "\n".join(f"--- {k}\n{v[-2500:]}" for k, v in result.logs.items())
    assert result.termination == TerminationReason.COMPLETED, why

    # the scaffold's model calls went through the proxy, and were captured
    traj = result.trajectory
    assert traj is not None and traj.num_calls >= 1 and traj.segments, why
    for seg in traj.segments:
        assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs)
    policy = [
        lp for seg in traj.segments for m, lp in zip(seg.loss_mask, seg.logprobs, strict=True) if m
    ]
    assert policy and all(math.isfinite(lp) and lp <= 0.0 for lp in policy)

    # the action the model chose ran in the sandbox, and the verifier saw it
    assert result.reward is not None and result.reward.value == 1.0, why

    # the record is complete: timings, the scaffold's own logs, the bundle's version
    assert {"start_s", "agent_s", "verifier_s", "total_s"} <= set(result.timings)
    assert json.loads(result.logs["agent.bundle"])["version"] == adapter.bundle().version
    assert any(k.startswith("agent.") and k not in ("agent.bundle",) for k in result.logs)
