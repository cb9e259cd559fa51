"""Conformance suites. A plugin's test module subclasses one and provides its fixtures.

Each suite asserts the contract in ``slr.contracts`` as a user of the plugin relies on it;
a new backend, adapter or engine passes the same suite as the old ones.
"""

from __future__ import annotations

import asyncio
import math
import time

import attrs
import pytest
from attrs import frozen

from slr.contracts import (
    AgentAdapter,
    AgentOutcome,
    Bundle,
    Endpoint,
    Engine,
    SamplingParams,
    Sandbox,
)
from slr.headless import KILL_GRACE_S
from slr.testing.scripted_policy import Recorded, ScriptedPolicyStub


def _run(coro):
    return asyncio.run(coro)


class EngineTests:
    """Provide an ``engine`` fixture returning a ready ``Engine``."""

    def test_is_an_engine(self, engine):
        assert isinstance(engine, Engine)
        assert engine.max_context > 0

    def test_generate_respects_max_tokens_and_aligns_logprobs(self, engine):
        ids = engine.tokenizer.encode("Hello, my name is")
        gen = _run(engine.generate(ids, SamplingParams(max_tokens=5, seed=1), session_id="c1"))
        assert 1 <= len(gen.token_ids) <= 5
        assert len(gen.logprobs) == len(gen.token_ids)
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in gen.logprobs)
        if len(gen.token_ids) == 5:
            assert gen.finish_reason == "length"
        assert gen.weights_version == engine.weights_version

    def test_seeded_sampling_is_reproducible(self, engine):
        ids = engine.tokenizer.encode("Once upon a time")
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=1234)
        a = _run(engine.generate(ids, params, session_id="c2"))
        b = _run(engine.generate(ids, params, session_id="c3"))
        assert a.token_ids == b.token_ids

    def test_health(self, engine):
        assert _run(engine.health()) is True


class SandboxBackendTests:
    """Provide ``sandbox`` (a started ``Sandbox`` for a simple task, stopped afterwards)."""

    def test_is_a_sandbox(self, sandbox):
        assert isinstance(sandbox, Sandbox)

    def test_exec_separates_streams_and_exit_code(self, sandbox):
        res = _run(sandbox.exec("echo out; echo err >&2; exit 3"))
        assert res.exit_code == 3
        assert res.stdout.strip() == "out"
        assert res.stderr.strip() == "err"

    def test_exec_timeout_kills(self, sandbox):
        res = _run(sandbox.exec("sleep 30", timeout_s=1))
        assert res.timed_out
        after = _run(sandbox.exec("pgrep -x sleep || echo none"))
        assert "none" in after.stdout

    def test_upload_download_roundtrip(self, sandbox, tmp_path):
        src = tmp_path / "in"
        src.mkdir()
        (src / "a.txt").write_text("hello")
        _run(sandbox.upload(src, "/tmp/slr-in"))
        res = _run(sandbox.exec("cat /tmp/slr-in/a.txt"))
        assert res.stdout == "hello"
        _run(sandbox.exec("echo -n back > /tmp/slr-out.txt"))
        _run(sandbox.download("/tmp/slr-out.txt", tmp_path / "out.txt"))
        assert (tmp_path / "out.txt").read_text() == "back"


@frozen(kw_only=True)
class AgentRun:
    """One scripted run of a scaffold: what it returned, what it asked, what it left."""

    outcome: AgentOutcome
    requests: list[Recorded]
    hello: str | None
    leftovers: str
    duration_s: float
    bundle: Bundle


class AgentAdapterTests:
    """The contract every agent adapter keeps, checked against its real scaffold.

    Provide the fixtures:

    - ``adapter``: the ``AgentAdapter`` under test.
    - ``sandbox_factory``: an async callable ``start(bundle) -> Sandbox`` that starts a
      fresh sandbox with ``bundle.path`` mounted read-only at the same path (the suite stops
      it), and in which the endpoint URL from ``sandbox.proxy_url(url)`` reaches the host.
    - ``hello_script``: the ``Reply`` list with which a model makes this scaffold create
      ``hello.txt`` containing ``hello`` in its working directory, in the scaffold's own
      action format (tool call, JSON command, bash block), and then finish.

    The model is ``ScriptedPolicyStub``: here the adapter is under test, not a model. Each
    scenario runs the scaffold once (class-scoped), and the assertions share that run.
    """

    timeout_s: float = 240.0
    hang_timeout_s: float = 30.0  # long enough for a slow start to reach the model
    # Scaffolds may retry a refused call for minutes (Claude Code does, with back-off);
    # this scenario checks that the adapter reports rather than raises, and cleans up.
    refused_timeout_s: float = 45.0

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

    @pytest.fixture(scope="class")
    @classmethod
    def hang_run(cls, adapter, sandbox_factory, scripted_policy):
        scripted_policy.reset(mode="hang")
        try:
            return _run(_agent_run(adapter, sandbox_factory, scripted_policy, cls.hang_timeout_s))
        finally:
            scripted_policy.reset()

    @pytest.fixture(scope="class")
    @classmethod
    def refused_run(cls, adapter, sandbox_factory, scripted_policy):
        scripted_policy.reset(mode="unauthorized")
        try:
            return _run(
                _agent_run(adapter, sandbox_factory, scripted_policy, cls.refused_timeout_s)
            )
        finally:
            scripted_policy.reset()

    # -- the contract ---------------------------------------------------------------------

    def test_is_an_adapter(self, adapter):
        assert isinstance(adapter, AgentAdapter)
        assert adapter.protocol in ("openai", "anthropic")

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
    def test_timeout_is_enforced_and_nothing_is_left_running(self, hang_run):
        assert hang_run.requests, "the scaffold never reached the endpoint before hanging"
        assert hang_run.outcome.timed_out
        assert hang_run.outcome.exit_code is None
        # the run returned close to the limit: killed, not waited for
        assert hang_run.duration_s < self.hang_timeout_s + KILL_GRACE_S
        assert hang_run.leftovers == "", f"processes left running: {hang_run.leftovers}"

    @pytest.mark.slow
    def test_a_refusing_model_is_reported_not_raised(self, refused_run):
        # _agent_run would have raised; an outcome with logs came back instead.
        assert isinstance(refused_run.outcome, AgentOutcome)
        assert refused_run.requests, "the scaffold never reached the endpoint"
        assert refused_run.hello is None
        assert refused_run.leftovers == ""


MODEL = "slr-policy"
API_KEY = "slr-conformance-key"


async def _agent_run(adapter, sandbox_factory, stub, timeout_s: float) -> AgentRun:
    bundle = adapter.bundle()
    sandbox = await sandbox_factory(bundle)
    try:
        endpoint = Endpoint(base_url=sandbox.proxy_url(stub.url), api_key=API_KEY, model=MODEL)
        started = time.monotonic()
        outcome = await adapter.run(
            sandbox, "Create hello.txt containing hello.", endpoint, timeout_s=timeout_s
        )
        took = time.monotonic() - started
        hello = await sandbox.exec("cat hello.txt")
        # every scaffold process runs from the bundle; none may outlive the run
        left = await sandbox.exec(_LEFTOVERS, env={"SLR_BUNDLE": str(bundle.path)})
        return AgentRun(
            outcome=outcome,
            requests=list(stub.requests),
            hello=hello.stdout if hello.exit_code == 0 else None,
            leftovers=left.stdout.strip(),
            duration_s=took,
            bundle=bundle,
        )
    finally:
        await sandbox.stop()


# Scans /proc (images may lack ps). The path comes through the environment so that this
# shell's own command line does not match it.
_LEFTOVERS = (
    "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null) || continue; "
    'case "$c" in *"$SLR_BUNDLE"*) echo "${p#/proc/} $c";; esac; done; true'
)


def _tail(run: AgentRun) -> str:
    return "\n".join(f"--- {k}\n{v[-3000:]}" for k, v in run.outcome.logs.items())
