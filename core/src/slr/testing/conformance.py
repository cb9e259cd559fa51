"""Conformance suites. A plugin's test module subclasses one and provides its fixtures.

Each suite asserts the contract in ``slr.contracts`` as a user of the plugin relies on it;
a new backend, adapter or engine passes the same suite as the old ones.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from slr.contracts import AgentAdapter, ContextOverflow, Engine, SamplingParams, Sandbox


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
