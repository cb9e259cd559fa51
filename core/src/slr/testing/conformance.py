"""Conformance suites. A plugin's test module subclasses one and provides its fixtures.

Each suite asserts the contract in ``slr.contracts`` as a user of the plugin relies on it;
a new backend, adapter or engine passes the same suite as the old ones.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import threading

import pytest

from slr.contracts import (
    AgentAdapter,
    ContextOverflow,
    Engine,
    SamplingParams,
    Sandbox,
    SandboxBackend,
    SandboxError,
    TerminationReason,
)
from slr.plugins import get_plugin_manager
from slr.testing.sandbox_probes import (
    HTTP_PROBE,
    INTERFACES,
    PROXY_REPLY,
    ProbeAgent,
    ProbeVerifier,
    decoy_listener,
    interfaces,
    probe_connect,
    stand_in_proxy,
)
from slr.trial import StandInSessions, new_trial_id, run_trial, run_trials


def _run(coro):
    return asyncio.run(coro)


class EngineTests:
    """Provide an ``engine`` fixture returning a ready ``Engine``.

    The engine must serve a tokenizer whose ``encode`` gives valid prompt ids. Log-prob
    *values* are checked against a forward pass by each engine's own tests (only they can
    run the model); this suite checks the contract every caller relies on.
    """

    def _prompt(self, engine, text: str = "Hello, my name is") -> list[int]:
        return list(engine.tokenizer.encode(text))

    def test_is_an_engine(self, engine):
        assert isinstance(engine, Engine)
        assert engine.max_context > 0
        assert isinstance(engine.weights_version, int)

    def test_generate_respects_max_tokens_and_aligns_logprobs(self, engine):
        ids = self._prompt(engine)
        gen = _run(engine.generate(ids, SamplingParams(max_tokens=5, seed=1), session_id="c1"))
        assert 1 <= len(gen.token_ids) <= 5
        assert len(gen.logprobs) == len(gen.token_ids)
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in gen.logprobs)
        if len(gen.token_ids) == 5:
            assert gen.finish_reason == "length"
        assert gen.weights_version == engine.weights_version
        assert gen.prompt_tokens == len(ids)

    def test_seeded_sampling_is_reproducible(self, engine):
        ids = self._prompt(engine, "Once upon a time")
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=1234)
        a = _run(engine.generate(ids, params, session_id="c2"))
        b = _run(engine.generate(ids, params, session_id="c3"))
        assert a.token_ids == b.token_ids

    def test_greedy_is_deterministic_and_stop_token_ids_stop(self, engine):
        ids = self._prompt(engine, "The numbers one, two, three")
        greedy = SamplingParams(max_tokens=6, temperature=0.0)
        a = _run(engine.generate(ids, greedy, session_id="c4"))
        b = _run(engine.generate(ids, greedy, session_id="c5"))
        assert a.token_ids == b.token_ids
        if len(a.token_ids) >= 3:
            stop_at = a.token_ids[1]
            first = a.token_ids.index(stop_at)
            stopped = _run(
                engine.generate(
                    ids,
                    SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=[stop_at]),
                    session_id="c6",
                )
            )
            assert stopped.token_ids == a.token_ids[: first + 1]
            assert stopped.finish_reason == "stop"

    def test_concurrent_requests_all_complete(self, engine):
        async def many():
            return await asyncio.gather(
                *(
                    engine.generate(
                        self._prompt(engine, "word " * (i + 1)),
                        SamplingParams(max_tokens=3 + i, seed=i),
                        session_id=f"cc{i}",
                    )
                    for i in range(4)
                )
            )

        gens = _run(many())
        for i, gen in enumerate(gens):
            assert 1 <= len(gen.token_ids) <= 3 + i
            assert len(gen.logprobs) == len(gen.token_ids)

    def test_prompt_longer_than_context_raises_context_overflow(self, engine):
        token = self._prompt(engine, "a")[-1]
        with pytest.raises(ContextOverflow) as info:
            _run(engine.generate([token] * engine.max_context, SamplingParams(max_tokens=1)))
        assert info.value.max_context == engine.max_context
        assert str(engine.max_context) in str(info.value)

    def test_health(self, engine):
        assert _run(engine.health()) is True


class SandboxBackendTests:
    """The sandbox contract, as the trial runner and the anti-hacking rules rely on it.

    Provide ``backend`` (a ``SandboxBackend``; session scope recommended) and
    ``example_tasks`` (loaded ``slr.tasks.Task``s; the bundled ``examples/tasks`` or tasks
    like them: the first is a simple one, one has a git repository with history and
    ``restore_git_history = true``, each has an oracle solution). Optionally override
    ``unreachable_hosts``: addresses on this machine that the agent phase must not reach
    (a gateway, containers the test made), as ``host`` (the suite's own host listener's
    port is used) or ``host:port``. Each must be reachable from the host (checked).
    """

    @pytest.fixture
    def unreachable_hosts(self) -> list[str]:
        return ["127.0.0.1"]

    @pytest.fixture
    def simple_task(self, example_tasks):
        return example_tasks[0]

    @pytest.fixture
    def sandbox(self, backend, simple_task):
        sb = _run(
            backend.start(
                simple_task, trial_id=new_trial_id("conformance"), labels={"slr.test": "1"}
            )
        )
        yield sb
        _run(sb.stop())

    def test_is_a_sandbox(self, backend, sandbox):
        assert isinstance(backend, SandboxBackend)
        assert isinstance(sandbox, Sandbox)

    def test_exec_separates_streams_and_exit_code(self, sandbox):
        res = _run(sandbox.exec("echo out; echo err >&2; exit 3"))
        assert res.exit_code == 3
        assert res.stdout.strip() == "out"
        assert res.stderr.strip() == "err"
        assert not res.timed_out

    def test_exec_argv_cwd_and_env(self, sandbox):
        res = _run(
            sandbox.exec(
                ["sh", "-c", 'pwd; echo "$GREETING"'], cwd="/tmp", env={"GREETING": "hi there"}
            )
        )
        assert res.ok, res.stderr
        assert res.stdout.split("\n")[:2] == ["/tmp", "hi there"]

    def test_exec_timeout_kills_the_process_tree(self, sandbox):
        tag = f"{os.getpid() % 1000}{threading.get_ident() % 1000}"
        a, b = f"3141.{tag}", f"2718.{tag}"
        res = _run(sandbox.exec(f"sleep {a} & (sleep {b}; true) & wait", timeout_s=1))
        assert res.timed_out
        inside = _run(sandbox.exec(f"pgrep -f 'sleep ({a}|{b})' || echo none"))
        assert inside.stdout.strip() == "none"
        # The sandbox's processes are this machine's processes too (same kernel).
        assert not _host_processes_matching(a) and not _host_processes_matching(b)

    def test_upload_download_roundtrip(self, sandbox, tmp_path):
        src = tmp_path / "in"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("hello")
        (src / "sub" / "b.txt").write_text("nested")
        _run(sandbox.upload(src, "/tmp/slr-in"))
        res = _run(sandbox.exec("cat /tmp/slr-in/a.txt /tmp/slr-in/sub/b.txt"))
        assert res.stdout == "hellonested"
        _run(sandbox.upload(src / "a.txt", "/tmp/renamed.txt"))
        assert _run(sandbox.exec("cat /tmp/renamed.txt")).stdout == "hello"
        _run(sandbox.exec("mkdir -p /tmp/out/d && echo -n back > /tmp/out/d/f.txt"))
        _run(sandbox.download("/tmp/out/d/f.txt", tmp_path / "f.txt"))
        assert (tmp_path / "f.txt").read_text() == "back"
        _run(sandbox.download("/tmp/out", tmp_path / "outdir"))
        assert (tmp_path / "outdir" / "d" / "f.txt").read_text() == "back"

    def test_download_of_a_missing_path_raises(self, sandbox, tmp_path):
        with pytest.raises(FileNotFoundError):
            _run(sandbox.download("/no/such/file", tmp_path / "x"))

    def test_agent_phase_reaches_the_proxy_and_nothing_else(self, sandbox, unreachable_hosts):
        with stand_in_proxy() as url, decoy_listener() as port:
            inner = sandbox.proxy_url(url + "/session-1")
            reply = _run(sandbox.exec(["python3", "-c", HTTP_PROBE, inner])).stdout
            assert PROXY_REPLY in reply and "/v1/session-1/models" in reply, reply
            targets = [_target(h, port) for h in unreachable_hosts]
            for target in targets:  # control: each target is up, as seen from the host
                socket.create_connection(target, timeout=3).close()
            seen = _run(probe_connect(sandbox, targets))
            assert seen and all(v.startswith("closed") for v in seen.values()), seen
        ifaces = _run(sandbox.exec(["python3", "-c", INTERFACES])).stdout
        assert interfaces(ifaces) == {"lo"}, ifaces

    def test_verifier_phase_without_network_cuts_the_proxy(self, sandbox):
        with stand_in_proxy() as url:
            inner = sandbox.proxy_url(url)
            _run(sandbox.set_network("none"))
            reply = _run(sandbox.exec(["python3", "-c", HTTP_PROBE, inner])).stdout
            assert PROXY_REPLY not in reply and reply.startswith("error"), reply

    def test_stop_is_idempotent_and_final(self, backend, simple_task):
        sb = _run(backend.start(simple_task, trial_id=new_trial_id("stop"), labels={}))
        _run(sb.stop())
        _run(sb.stop())
        with pytest.raises(SandboxError):
            _run(sb.exec("true"))

    def test_cleanup_orphans_counts(self, backend):
        assert _run(backend.cleanup_orphans()) >= 0

    @pytest.mark.parametrize("agent_name", ["oracle", "nop"])
    def test_every_example_task_oracle_scores_1_nop_scores_0(
        self, backend, example_tasks, agent_name
    ):
        agent = get_plugin_manager().get("agent", agent_name).create()
        verifier = get_plugin_manager().get("verifier", "harbor").create()
        results = _run(
            run_trials(
                [
                    lambda t=t: run_trial(
                        t,
                        backend=backend,
                        agent=agent,
                        verifier=verifier,
                        session_factory=StandInSessions(),
                        agent_name=agent_name,
                    )
                    for t in example_tasks
                ],
                concurrency=3,
            )
        )
        want = 1.0 if agent_name == "oracle" else 0.0
        for r in results:
            assert r.termination == TerminationReason.COMPLETED, (r.task_id, r.error, r.logs)
            assert r.reward is not None and r.reward.value == want, (r.task_id, r.logs)
            assert {"start_s", "agent_s", "verifier_s", "total_s"} <= set(r.timings)

    def test_agent_phase_hides_tests_solution_history_and_network(
        self, backend, example_tasks, unreachable_hosts
    ):
        task = next(t for t in example_tasks if t.restore_git_history)
        verifier = ProbeVerifier(get_plugin_manager().get("verifier", "harbor").create())
        with stand_in_proxy() as url, decoy_listener() as port:
            agent = ProbeAgent(targets=[_target(h, port) for h in unreachable_hosts])
            result = _run(
                run_trial(
                    task,
                    backend=backend,
                    agent=agent,
                    verifier=verifier,
                    session_factory=StandInSessions(url),
                )
            )
        seen = agent.seen
        view = seen["view"]
        assert view["tests"] == "0" and view["solution"] == "0", view
        assert view["found"].strip() == "", view  # no test.sh / solve.sh / hidden tests
        assert view["taskpath"] == "0", view  # the host's task folder is not visible
        assert view["commits"] == "1" and view["subjects"] == "Task snapshot|", view
        assert int(view["reflog"]) <= 1, view
        assert PROXY_REPLY in seen["proxy"], seen["proxy"]
        assert seen["connect"] and all(v.startswith("closed") for v in seen["connect"].values())
        assert seen["interfaces"] == {"lo"}
        # The verifier phase sees the real history again (the task asks for it).
        assert len(verifier.seen["subjects"]) > 1, verifier.seen
        assert result.termination == TerminationReason.COMPLETED, result.error
        assert result.reward is not None and result.reward.value == 0.0


def _target(host: str, port: int) -> tuple[str, int]:
    """``"10.1.2.3:8000"`` as given, or a bare host with the test listener's port."""
    if ":" in host:
        name, _, p = host.rpartition(":")
        return name, int(p)
    return host, port


def _host_processes_matching(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd and "pgrep" not in cmd:
            found.append(int(entry))
    return found


class AgentAdapterTests:
    """Provide ``adapter`` (an ``AgentAdapter`` instance)."""

    def test_is_an_adapter(self, adapter):
        assert isinstance(adapter, AgentAdapter)
        assert adapter.protocol in ("openai", "anthropic")

    @pytest.mark.slow
    def test_bundle_is_built_once(self, adapter):
        first = adapter.bundle()
        second = adapter.bundle()
        assert first == second
        assert first.path.exists()
        assert first.version
