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
import time

import attrs
import pytest
from attrs import frozen

from slr.agents.headless import KILL_GRACE_S, ScaffoldCrashed, bundle_root
from slr.agents.model_free import NopAgent, OracleAgent
from slr.agents.prestart import Prestarted
from slr.contracts import (
    AgentAdapter,
    AgentOutcome,
    Bundle,
    ContextOverflow,
    Endpoint,
    Engine,
    SamplingParams,
    Sandbox,
    SandboxBackend,
    SandboxError,
    TerminationReason,
)
from slr.rollout.trial import StandInSessions, new_trial_id, run_trial, run_trials
from slr.sandboxing.pool import PooledSandbox
from slr_testkit.sandbox_probes import (
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
from slr_testkit.scripted_policy import Recorded, ScriptedPolicyStub


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

    def test_stream_adds_up_to_generate(self, engine):
        ids = self._prompt(engine, "Once upon a time")
        params = SamplingParams(max_tokens=6, temperature=1.0, seed=99)

        async def both():
            chunks = [c async for c in engine.stream(ids, params, session_id="st1")]
            return chunks, await engine.generate(ids, params, session_id="st2")

        chunks, gen = _run(both())
        assert chunks and chunks[-1].finish_reason == gen.finish_reason
        assert all(c.finish_reason is None for c in chunks[:-1])
        for c in chunks:
            assert len(c.token_ids) == len(c.logprobs) == len(c.weights_versions)
        assert tuple(t for c in chunks for t in c.token_ids) == gen.token_ids
        streamed = [lp for c in chunks for lp in c.logprobs]
        assert max(abs(a - b) for a, b in zip(streamed, gen.logprobs, strict=True)) <= 1e-4
        assert [v for c in chunks for v in c.weights_versions] == list(gen.weights_versions)
        assert set(gen.weights_versions) == {engine.weights_version}

    def test_stream_closed_early_leaves_the_engine_serving(self, engine):
        ids = self._prompt(engine)

        async def close_early():
            chunks = engine.stream(ids, SamplingParams(max_tokens=50, seed=3), session_id="st3")
            first = await anext(chunks)
            await chunks.aclose()
            return first, await engine.generate(ids, SamplingParams(max_tokens=2, seed=4))

        first, after = _run(close_early())
        assert len(first.token_ids) >= 1
        assert 1 <= len(after.token_ids) <= 2

    def test_stream_of_a_prompt_too_long_raises_context_overflow(self, engine):
        token = self._prompt(engine, "a")[-1]

        async def consume():
            async for _ in engine.stream(
                [token] * engine.max_context, SamplingParams(max_tokens=1)
            ):
                pass

        with pytest.raises(ContextOverflow):
            _run(consume())


class SandboxBackendTests:
    """The sandbox contract, as the trial runner and the anti-hacking rules rely on it.

    Provide ``backend`` (a ``SandboxBackend``; session scope recommended),
    ``example_tasks`` (loaded ``slr.tasks.Task``s; the bundled ``examples/tasks`` or tasks
    like them: the first is a simple one, one has a git repository with history and
    ``restore_git_history = true``, each has an oracle solution) and ``verifier`` (the
    ``Verifier`` that scores those tasks' tests, e.g. slr-verifier-harbor's for Harbor
    tasks). The agents are the core's own model-free ones (``oracle``, ``nop``,
    ``slr.agents.model_free``). Optionally override
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
        self, backend, example_tasks, verifier, agent_name
    ):
        agent = OracleAgent() if agent_name == "oracle" else NopAgent()
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
        self, backend, example_tasks, verifier, unreachable_hosts
    ):
        task = next(t for t in example_tasks if t.restore_git_history)
        verifier = ProbeVerifier(verifier)
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


@frozen(kw_only=True)
class AgentRun:
    """One scripted run of a scaffold: what it returned, what it asked, what it left."""

    outcome: AgentOutcome
    requests: list[Recorded]
    hello: str | None
    leftovers: str
    duration_s: float
    timeout_s: float
    bundle: Bundle
    prestarted: Prestarted | None = None
    #: Seconds from the start of the run to the scaffold's first model call (None: none).
    first_call_s: float | None = None


class AgentAdapterTests:
    """The contract every agent adapter keeps. Provide an ``adapter`` fixture.

    Adapters whose scaffold talks to a model subclass ``ScaffoldAdapterTests``, which adds
    the checks against the real scaffold; agents that call no model (the core's ``oracle``
    and ``nop``) subclass this one.
    """

    def test_is_an_adapter(self, adapter):
        assert isinstance(adapter, AgentAdapter)
        assert adapter.protocol in ("openai", "anthropic")
        # Read directly by the trial runner and `slr eval`: every adapter has them.
        assert isinstance(adapter.needs_model, bool) and isinstance(adapter.accepts_task, bool)

    def test_config_is_documented(self, adapter):
        config = getattr(adapter, "config", None)
        if config is None or not attrs.has(type(config)):
            pytest.skip("this adapter has no config class")
        for f in attrs.fields(type(config)):
            assert f.metadata.get("doc"), f"{type(config).__name__}.{f.name} has no doc"

    @pytest.mark.slow
    def test_bundle_is_built_once(self, adapter):
        first = adapter.bundle()
        second = adapter.bundle()
        assert first == second
        assert first.path.is_dir()
        assert first.version


class ScaffoldAdapterTests(AgentAdapterTests):
    """``AgentAdapterTests`` plus the contract checked against the real scaffold.

    Provide the fixtures:

    - ``adapter``: the ``AgentAdapter`` under test (class- or session-scoped).
    - ``sandbox_factory``: an async callable ``start(bundle) -> Sandbox`` that starts a
      fresh sandbox with ``bundle.path`` mounted read-only where the trial runner mounts it
      (the suite stops it), and in which ``sandbox.proxy_url(url)`` reaches the host.
      slr's pytest plugin provides one on the ``local`` backend (``$SLR_TEST_BACKEND``).
    - ``hello_script``: the ``Reply`` list with which a model makes this scaffold create
      ``hello.txt`` containing ``hello`` in its working directory, in the scaffold's own
      action format (tool call, JSON command, bash block), and then finish.

    The model is ``ScriptedPolicyStub``: here the adapter is under test, not a model. Each
    scenario runs the scaffold once (class-scoped), and the assertions share that run; the
    refusal scenario runs beside the hang scenario once the hung scaffold has reached the
    model (it then only waits for its limit).
    """

    timeout_s: float = 240.0
    # The hang scenario always runs until its limit (and the refusal one does for a
    # scaffold that retries), so both limits are what the scenario needs, not a slow run's
    # allowance: the scaffold must have reached the model when the limit strikes. Each is
    # the larger of its floor here and ``start_up_margin`` times the scaffold's start-up as
    # its hello run measured it (``AgentRun.first_call_s``), so a scaffold that starts in
    # seconds is killed after seconds, and one that starts slowly (a loaded machine, a
    # heavy SDK) still reaches the model first.
    hang_timeout_s: float = 10.0
    # Scaffolds may retry a refused call for minutes (Claude Code does, with back-off);
    # this scenario checks that the adapter reports rather than raises, and cleans up, and
    # needs only the first refusal to have arrived.
    refused_timeout_s: float = 10.0
    start_up_margin: float = 2.0

    # -- fixtures -------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def scripted_policy(cls):
        stub = ScriptedPolicyStub()
        yield stub
        stub.close()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_run(cls, adapter, sandbox_factory, scripted_policy, hello_script):
        scripted_policy.reset(hello_script)
        return _run(_agent_run(adapter, sandbox_factory, scripted_policy, cls.timeout_s))

    @classmethod
    def _limit(cls, floor: float, hello_run: AgentRun) -> float:
        if hello_run.first_call_s is None:  # the hello tests say why
            return floor
        return max(floor, cls.start_up_margin * hello_run.first_call_s)

    @pytest.fixture(scope="class")
    @classmethod
    def refusing_policy(cls):
        """A second endpoint that refuses every model call (401), so that the refusal
        scenario can run while the hang scenario holds ``scripted_policy``."""
        stub = ScriptedPolicyStub()
        stub.reset(mode="unauthorized")
        yield stub
        stub.close()

    @pytest.fixture(scope="class")
    @classmethod
    def hang_and_refused_runs(
        cls, adapter, sandbox_factory, scripted_policy, refusing_policy, hello_run
    ) -> tuple[AgentRun, AgentRun]:
        """The hang and the refusal scenario, the second started once the first has made
        its model call: from then on the hung scaffold only waits for its limit, so the
        refused one starts up alone on the CPU, and the class pays the hang's wait once
        instead of both runs one after the other."""
        hang_limit = cls._limit(cls.hang_timeout_s, hello_run)
        refused_limit = cls._limit(cls.refused_timeout_s, hello_run)

        def both(scale: float) -> tuple[AgentRun, AgentRun]:
            scripted_policy.reset(mode="hang")
            refusing_policy.reset(mode="unauthorized")
            return _run(
                _hang_then_refused(
                    adapter, sandbox_factory, scripted_policy, refusing_policy,
                    scale * hang_limit, scale * refused_limit,
                )
            )  # fmt: skip

        try:
            hang, refused = both(1.0)
            if not hang.requests:
                # The scenario did not happen: the limit struck before the scaffold reached
                # the model (its start-up on a loaded machine varied more than the margin
                # over its hello run). Once more with twice the limits; a scaffold that
                # never calls the model still fails (_too_slow_to_start says which).
                hang, refused = both(2.0)
            return hang, refused
        finally:
            scripted_policy.reset()

    @pytest.fixture(scope="class")
    @classmethod
    def hang_run(cls, hang_and_refused_runs):
        return hang_and_refused_runs[0]

    @pytest.fixture(scope="class")
    @classmethod
    def refused_run(cls, hang_and_refused_runs):
        return hang_and_refused_runs[1]

    # -- the contract ---------------------------------------------------------------------

    @pytest.mark.slow
    def test_calls_the_endpoint_in_its_declared_protocol(self, adapter, hello_run):
        calls = [r for r in hello_run.requests if r.method == "POST"]
        assert calls, f"the scaffold made no model call; its logs: {_tail(hello_run)}"
        path = "/v1/messages" if adapter.protocol == "anthropic" else "/v1/chat/completions"
        for call in calls:
            assert call.path.split("?")[0] == path, call.path
            assert call.body.get("model") == MODEL
            key = call.headers.get("x-api-key") or call.headers.get("authorization", "")
            assert key.removeprefix("Bearer ") == API_KEY

    @pytest.mark.slow
    def test_executes_the_models_action_and_exits(self, hello_run):
        assert not hello_run.outcome.timed_out, _tail(hello_run)
        assert hello_run.outcome.exit_code == 0, _tail(hello_run)
        assert hello_run.hello is not None, f"no hello.txt; logs: {_tail(hello_run)}"
        assert hello_run.hello.strip() == "hello"
        assert hello_run.requests, "the scaffold finished without asking the model"

    @pytest.mark.slow
    def test_collects_the_scaffolds_own_logs(self, hello_run):
        own = {k: v for k, v in hello_run.outcome.logs.items() if k not in ("stdout", "stderr")}
        assert (
            any(v.strip() for v in own.values()) or hello_run.outcome.logs.get("stdout", "").strip()
        ), "no scaffold logs collected"
        assert all(isinstance(v, str) for v in hello_run.outcome.logs.values())

    @pytest.mark.slow
    def test_timeout_is_enforced_and_nothing_is_left_running(self, hang_run, hello_run):
        assert hang_run.requests, _too_slow_to_start(hang_run, hello_run)
        assert hang_run.outcome.timed_out
        assert hang_run.outcome.exit_code is None
        # the run returned close to the limit: killed, not waited for
        assert hang_run.duration_s < hang_run.timeout_s + KILL_GRACE_S
        assert hang_run.leftovers == "", f"processes left running: {hang_run.leftovers}"

    @pytest.mark.slow
    def test_a_refusing_model_ends_the_run_cleanly(self, refused_run, hello_run):
        # An outcome (the scaffold gave up, or ran out of time retrying) or ScaffoldCrashed
        # (it died of it): both are records for the trial runner; anything else raised.
        assert isinstance(refused_run.outcome, AgentOutcome)
        assert refused_run.requests, _too_slow_to_start(refused_run, hello_run)
        assert refused_run.hello is None
        assert refused_run.leftovers == ""

    @pytest.mark.slow
    def test_a_scaffold_that_cannot_start_raises_scaffold_crashed(
        self, adapter, sandbox_factory, scripted_policy, tmp_path_factory
    ):
        # A sandbox whose bundle mount holds nothing runnable: the scaffold is not found.
        empty = tmp_path_factory.mktemp("empty-bundle")
        real = adapter.bundle()

        async def go():
            sandbox = await sandbox_factory(Bundle(path=empty, version=real.version))
            try:
                endpoint = Endpoint(
                    base_url=sandbox.proxy_url(scripted_policy.url), api_key=API_KEY, model=MODEL
                )
                with pytest.raises(ScaffoldCrashed) as info:
                    await adapter.run(sandbox, "Create hello.txt.", endpoint, timeout_s=60)
                return info.value
            finally:
                await sandbox.stop()

        crashed = _run(go())
        assert crashed.outcome.exit_code is not None and crashed.outcome.exit_code != 0


def _too_slow_to_start(run: AgentRun, hello_run: AgentRun) -> str:
    """Why a scenario saw no request: the scaffold had not reached the model by its limit."""
    measured = (
        "its hello run made no model call either"
        if hello_run.first_call_s is None
        else f"its hello run made its first model call after {hello_run.first_call_s:.1f} s"
    )
    return (
        f"the scaffold never reached the endpoint within its {run.timeout_s:.1f} s limit "
        f"({measured}): its start-up varies more than start_up_margin allows"
    )


class PrestartingAdapterTests:
    """For a ``ScaffoldAdapterTests`` adapter with ``prestart(sandbox)``: its scaffold,
    started ahead in the sandbox (as the warm pool does), takes the trial and does the
    same work as started afresh. Subclass it beside ``ScaffoldAdapterTests``; same fixtures.
    """

    @pytest.fixture(scope="class")
    @classmethod
    def prestarted_run(cls, adapter, sandbox_factory, scripted_policy, hello_script):
        scripted_policy.reset(hello_script)
        try:
            run = _agent_run(adapter, sandbox_factory, scripted_policy, 240.0, prestart=True)
            return _run(run)
        finally:
            scripted_policy.reset()

    @pytest.mark.slow
    def test_a_prestarted_scaffold_takes_the_trial(self, prestarted_run):
        run = prestarted_run
        assert run.prestarted is not None, "prestart() started nothing"
        assert not run.outcome.timed_out and run.outcome.exit_code == 0, _tail(run)
        assert run.hello is not None and run.hello.strip() == "hello", _tail(run)
        assert [r for r in run.requests if r.method == "POST"], "no model call"
        # the prestarted interpreter ran the trial and ended with it (a fresh start
        # would have left it waiting)
        assert not run.prestarted.alive
        assert run.prestarted.server.result().exit_code == 0
        assert run.leftovers == "", f"processes left running: {run.leftovers}"


MODEL = "slr-policy"
API_KEY = "slr-conformance-key"


async def _agent_run(
    adapter, sandbox_factory, stub, timeout_s: float, *, prestart: bool = False
) -> AgentRun:
    bundle = adapter.bundle()
    sandbox = await sandbox_factory(bundle)
    prestarted = None
    if prestart:  # as the warm pool does before the trial is known
        prestarted = await adapter.prestart(sandbox)
        sandbox = PooledSandbox(sandbox, pool_start_s=0.0, prestarted=prestarted)
    try:
        endpoint = Endpoint(base_url=sandbox.proxy_url(stub.url), api_key=API_KEY, model=MODEL)
        started = time.monotonic()
        try:
            outcome = await adapter.run(
                sandbox, "Create hello.txt containing hello.", endpoint, timeout_s=timeout_s
            )
        except ScaffoldCrashed as exc:
            outcome = exc.outcome
        took = time.monotonic() - started
        calls = stub.model_calls()
        hello = await sandbox.exec("cat hello.txt")
        # every scaffold process runs from the bundle; none may outlive the run
        root = await bundle_root(sandbox, bundle)
        left = await sandbox.exec(_LEFTOVERS, env={"SLR_BUNDLE": root})
        return AgentRun(
            outcome=outcome,
            requests=list(stub.requests),
            hello=hello.stdout if hello.exit_code == 0 else None,
            leftovers=left.stdout.strip(),
            duration_s=took,
            timeout_s=timeout_s,
            bundle=bundle,
            prestarted=prestarted,
            first_call_s=calls[0].at - started if calls else None,
        )
    finally:
        await sandbox.stop()


async def _hang_then_refused(
    adapter, sandbox_factory, hanging, refusing, hang_limit: float, refused_limit: float
) -> tuple[AgentRun, AgentRun]:
    """Run the hang scenario on ``hanging``; when its first model call arrives (or the run
    ends without one), start the refusal scenario on ``refusing`` beside it."""
    loop = asyncio.get_running_loop()
    called = asyncio.Event()
    hanging.on_model_call = lambda: loop.call_soon_threadsafe(called.set)
    hang = asyncio.create_task(_agent_run(adapter, sandbox_factory, hanging, hang_limit))
    waiter = asyncio.create_task(called.wait())
    try:
        await asyncio.wait({hang, waiter}, return_when=asyncio.FIRST_COMPLETED)
        refused = await _agent_run(adapter, sandbox_factory, refusing, refused_limit)
        return await hang, refused
    finally:
        hanging.on_model_call = None
        waiter.cancel()
        if not hang.done():  # the refusal run raised: end the hung one too
            hang.cancel()
        await asyncio.gather(hang, waiter, return_exceptions=True)


# Scans /proc (images may lack ps). The bundle path comes through the environment, and a
# process whose command line holds this probe (itself, or a launcher that carries it) is
# skipped: only scaffold processes match.
_LEFTOVERS = (
    ": slr-leftover-probe; "
    "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null) || continue; "
    'case "$c" in *slr-leftover-probe*) ;; *"$SLR_BUNDLE"*) echo "${p#/proc/} $c";; esac; '
    "done; true"
)


def _tail(run: AgentRun) -> str:
    return "\n".join(f"--- {k}\n{v[-3000:]}" for k, v in run.outcome.logs.items())
