"""Fixed cost per trial (everything but model time): the warm sandbox pool, and agent start-up.

    .venv/bin/python bench/trial_overhead.py --backend local --backend docker \\
        --agent oracle --agent mini-swe-agent --agent openhands --agent terminus [--trials 5] [--json]

Every trial is the ``hello-world`` example task, run one after another; every figure comes
from the trial's own ``costs`` record (slr.rollout.costs): start → agent phase (``sandbox_start``),
process start → first model call (``agent_startup``), the whole fixed wall time (all but
model time), and sandbox CPU by phase (pool CPU included: a pooled sandbox's meter runs
from its creation). The settings of one agent and backend alternate trial by trial in one
run, so load drift hits them alike. Medians; ratios to the first setting.

Per agent:

- ``oracle`` (no model): no pool vs a warm pool of 2;
- ``mini-swe-agent``, answered by a scripted endpoint (two replies: write the file, submit;
  it stands in for the proxy and the engine, so model time is ~0 and what is left is the
  fixed cost): ``before`` is the adapter as it was (litellm, and the bundle as the earlier
  recipe built it, without bytecode for the standard library: the cache's
  ``mini-swe-agent-<version>-py3.12`` folder; the setting is skipped when it is not there),
  ``litellm`` the same client on today's bundle (bytecode compiled at build), ``after``
  today's default (client ``requests``: mini's own OpenRouter classes pointed at the
  endpoint, no litellm import), ``after+pool`` the same from a warm pool;
- ``openhands``, ``terminus``: the scaffold started afresh in each trial (no pool) and from
  a warm pool of 2 whose sandboxes start the scaffold's interpreter ahead, its heavy imports
  done (``[agent] prestart``, slr.agents.prestart), each with Python's default collector
  during the import (``before``, ``pre-before``: ``freeze_imports = false``) and with the
  collector paused and the import frozen (``after``, ``pre-after``: the default). The
  interpreter's CPU is the sandbox's, so it shows in ``start CPU s``
  (``costs.cpu_s.sandbox_start``): ``+pool CPU s`` adds it to the start-up's own
  (``costs.cpu_s.agent_startup``), the figure the start-up goal counts. ``claude-code``,
  ``opencode`` (native binaries): as they are. Each answered by a scripted endpoint as its
  adapter test scripts it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import attrs
import harness

from slr.contracts import Endpoint, Trajectory
from slr.plugins import get_plugin_manager
from slr.rollout.costs import ModelClock, fixed_wall_s
from slr.rollout.trial import StandInSessions, bundle_mounts, new_trial_id, run_trial
from slr.sandboxing.pool import SandboxPool
from slr.tasks import load_task
from slr_testkit.scripted_policy import Reply, ScriptedPolicyStub, ToolCall

ROOT = Path(__file__).resolve().parents[1]
HELLO = "THOUGHT: write the file.\n\n```mswea_bash_command\nprintf 'hello\\n' > hello.txt\n```"
SUBMIT = "THOUGHT: done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


def _terminus(commands: list[str], done: bool) -> str:
    keys = [{"keystrokes": c, "duration": 0.1} for c in commands]
    reply = {"analysis": "-", "plan": "-", "commands": keys, "task_complete": done}
    return json.dumps(reply)


_WRITE = "printf 'hello\\n' > hello.txt"
# What each scaffold is answered: write the file, then end (as the adapter tests script it).
SCRIPTS = {
    "claude-code": [
        Reply(
            tool_calls=[ToolCall(name="Bash", arguments={"command": _WRITE, "description": "w"})]
        ),
        Reply(text="Created hello.txt."),
    ],
    "opencode": [
        Reply(
            tool_calls=[ToolCall(name="bash", arguments={"command": _WRITE, "description": "w"})]
        ),
        Reply(text="Created hello.txt."),
    ],
    "openhands": [
        Reply(
            tool_calls=[ToolCall(name="terminal", arguments={"command": _WRITE, "summary": "w"})]
        ),
        Reply(tool_calls=[ToolCall(name="finish", arguments={"message": "Created hello.txt."})]),
    ],
    "terminus": [Reply(text=_terminus([_WRITE + "\n"], True)), Reply(text=_terminus([], True))],
}


# Python scaffolds whose adapters prestart their interpreter in a pooled sandbox.
PRESTARTING = ("openhands", "terminus")


class ScriptedSessions:
    """A session factory whose sessions are scripted endpoints (a stand-in for the proxy and
    the engine), with the proxy's ``ModelClock`` so the trial records its first model call."""

    def __init__(self, script: list[Reply]) -> None:
        self.script = script
        self._open: dict[str, tuple[ScriptedPolicyStub, ModelClock]] = {}

    async def open(self, trial_id: str) -> tuple[Endpoint, Any]:
        stub, clock = ScriptedPolicyStub(self.script), ModelClock()
        stub.on_model_call = clock.call_arrived
        self._open[trial_id] = (stub, clock)
        return Endpoint(base_url=stub.url + "/v1", api_key="bench", model="scripted"), trial_id

    def clock(self, handle: str) -> ModelClock:
        return self._open[handle][1]

    async def close(self, handle: str) -> Trajectory | None:
        stub, _ = self._open.pop(handle)
        stub.close()
        return Trajectory(session_id=handle)


async def one(backend, task, agent, verifier, sessions) -> dict:
    result = await run_trial(
        task,
        backend=backend,
        agent=agent,
        verifier=verifier,
        session_factory=sessions,
        trial_id=new_trial_id("bench"),
        labels={"slr.bench": "1"},
    )
    assert result.costs is not None and result.reward is not None, result.error
    c = result.costs
    cpu = c.cpu_s or {}
    return {
        "start_s": c.wall_s["sandbox_start"],
        "startup_s": c.wall_s["agent_startup"],
        "fixed_wall_s": fixed_wall_s(c),
        "startup_cpu_s": cpu.get("agent_startup"),
        "start_cpu_s": cpu.get("sandbox_start"),
        # start-up with the pool's CPU (a prestarted interpreter's import) included
        "startup_pool_cpu_s": (
            cpu["agent_startup"] + cpu["sandbox_start"]
            if cpu.get("agent_startup") is not None and cpu.get("sandbox_start") is not None
            else None
        ),
        "cpu_s": sum(v for v in cpu.values() if v is not None) if cpu else None,
        "pooled": c.pool_start_s is not None,
        "reward": result.reward.value,
    }


def _old_python_bundle(name: str, agent: Any) -> Any:
    """A Python scaffold's bundle as the recipe before bytecode built it (its version had no
    recipe revision), from the cache; None when it is not there or not a Python scaffold."""
    from slr.agents import bundles

    c = agent.config
    if not hasattr(c, "python"):
        return None
    return bundles.existing(name, f"{c.version}-py{c.python}")


def settings(agent_name: str, backend: Any, task: Any, trials: int) -> dict[str, tuple]:
    """Setting name -> (backend or pool, agent, sessions), in the order they are reported."""
    pm = get_plugin_manager()
    if agent_name == "oracle":
        agent = pm.get("agent", "oracle").create()
        pool = SandboxPool(backend, size=2, mounts=bundle_mounts(agent.bundle()))
        pool.expect([task] * (trials + 1))  # the warm-up trial takes one
        return {
            "none": (backend, agent, StandInSessions()),
            "pool": (pool, agent, StandInSessions()),
        }
    if agent_name in PRESTARTING:
        spec = pm.get("agent", agent_name)
        after = spec.create()
        before = spec.create(attrs.evolve(after.config, freeze_imports=False))
        mounts = bundle_mounts(after.bundle())
        sessions = ScriptedSessions(SCRIPTS[agent_name])
        out = {"before": (backend, before, sessions), "after": (backend, after, sessions)}
        for mode, agent in (("pre-before", before), ("pre-after", after)):
            pool = SandboxPool(backend, size=2, mounts=mounts, prestart=agent.prestart)
            pool.expect([task] * (trials + 1))  # the warm-up trial takes one
            out[mode] = (pool, agent, sessions)
        return out
    if agent_name in SCRIPTS:
        agent = pm.get("agent", agent_name).create()
        sessions = ScriptedSessions(SCRIPTS[agent_name])
        old = _old_python_bundle(agent_name, agent)
        if old is None:  # a native scaffold, or no earlier bundle: measured as it is
            return {"default": (backend, agent, sessions)}
        before = type(agent)(agent.config)
        before.bundle = lambda: old  # the same adapter on the bundle built without bytecode
        return {"before": (backend, before, sessions), "after": (backend, agent, sessions)}
    if agent_name != "mini-swe-agent":
        raise SystemExit(
            f"--agent {agent_name!r}: this bench knows oracle, mini-swe-agent, {', '.join(SCRIPTS)}"
        )
    from slr_adapter_mini_swe_agent.adapter import MiniSweAgent, MiniSweAgentConfig

    sessions = ScriptedSessions([Reply(text=HELLO), Reply(text=SUBMIT)])
    after = MiniSweAgent()
    litellm = MiniSweAgent(MiniSweAgentConfig(client="litellm"))
    out: dict[str, tuple] = {}
    old = _old_python_bundle("mini-swe-agent", after)
    if old is not None:

        class Before(MiniSweAgent):
            def bundle(self):
                return old

        out["before"] = (backend, Before(MiniSweAgentConfig(client="litellm")), sessions)
    out["litellm"] = (backend, litellm, sessions)
    out["after"] = (backend, after, sessions)
    pool = SandboxPool(backend, size=2, mounts=bundle_mounts(after.bundle()))
    pool.expect([task] * (trials + 1))  # the warm-up trial takes one
    out["after+pool"] = (pool, after, sessions)
    return out


async def bench(backend_name: str, agent_name: str, trials: int) -> dict:
    pm = get_plugin_manager()
    backend = pm.get("sandbox_backend", backend_name).create()
    verifier = pm.get("verifier", "harbor").create()
    task = load_task(ROOT / "examples" / "tasks" / "hello-world")
    await backend.prepare(task)
    modes = settings(agent_name, backend, task, trials)
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    for target, agent, sessions in modes.values():  # warm-up: page cache, images, bundles
        await one(target, task, agent, verifier, sessions)
    for _ in range(trials):
        for mode, (target, agent, sessions) in modes.items():
            if isinstance(target, SandboxPool):
                await target.wait_ready()  # a warm sandbox is what the pool is for
            rows[mode].append(await one(target, task, agent, verifier, sessions))
    for target, _, _ in modes.values():
        if isinstance(target, SandboxPool):
            await target.drain()
    await backend.close()
    out: dict = {"backend": backend_name, "agent": agent_name, "trials": trials, "modes": {}}
    for mode, rs in rows.items():

        def med(key: str, rs: list[dict] = rs) -> float | None:
            vals = [r[key] for r in rs if r[key] is not None]
            return round(statistics.median(vals), 4) if vals else None

        out["modes"][mode] = {
            k: med(k)
            for k in (
                "start_s",
                "startup_s",
                "fixed_wall_s",
                "start_cpu_s",
                "startup_cpu_s",
                "startup_pool_cpu_s",
                "cpu_s",
            )
        } | {"pooled": sum(r["pooled"] for r in rs), "rewards": [r["reward"] for r in rs]}
    first = next(iter(out["modes"].values()))
    for m in out["modes"].values():
        for key in (
            "start_s",
            "startup_s",
            "startup_cpu_s",
            "startup_pool_cpu_s",
            "cpu_s",
            "fixed_wall_s",
        ):
            a, b = first[key], m[key]
            m[f"{key}_ratio"] = round(b / a, 3) if a and b is not None else None
    return out


def main() -> None:
    p = harness.parser(__doc__, whole_doc=True)
    p.add_argument("--backend", action="append", help="local (default) and/or docker")
    p.add_argument(
        "--agent",
        action="append",
        help="oracle (default), mini-swe-agent, openhands, terminus, claude-code, opencode",
    )
    p.add_argument("--trials", type=int, default=5, help="trials per setting, agent and backend")
    args = p.parse_args()
    out = harness.Output(args)
    from slr import log

    log.configure(level="warning")
    reports = [
        asyncio.run(bench(b, a, args.trials))
        for a in args.agent or ["oracle"]
        for b in args.backend or ["local"]
    ]
    columns = {
        "start_s": "start s",
        "startup_s": "startup s",
        "fixed_wall_s": "fixed wall s",
        "start_cpu_s": "start CPU s",
        "startup_cpu_s": "startup CPU s",
        "startup_pool_cpu_s": "+pool CPU s",
        "cpu_s": "sandbox CPU s",
        "startup_cpu_s_ratio": "startup ratio",
        "startup_pool_cpu_s_ratio": "+pool ratio",
        "cpu_s_ratio": "CPU ratio",
    }
    out.table(
        [("agent", "<"), ("backend", "<"), ("setting", "<")]
        + [(head, ">.3f") for head in columns.values()],
        [
            [r["agent"], r["backend"], mode, *(m[k] for k in columns)]
            for r in reports
            for mode, m in r["modes"].items()
        ],
    )
    out.result({"reports": reports})


if __name__ == "__main__":
    main()
