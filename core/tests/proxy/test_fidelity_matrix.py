"""The fidelity matrix: five scaffolds' sessions x three chat-template families, replayed
through the real proxy (official SDK clients) with forced decoding on the real hf engine.

Every cell must be green: the captured ids are what the engine produced, the trajectory
has the fewest segments the template allows, and a forward pass over each segment gives
every policy token its behaviour log-prob. ``bench/fidelity_matrix.py`` prints the same
matrix (and writes the table in docs/proxy.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slr_testkit.fidelity import markdown_table, replay, scenarios

TEMPLATES = Path(__file__).parent / "templates"
FAMILIES = ("chatml", "qwen3", "llama3")
# claude-code (Anthropic, streaming, sub-agent + compaction) and mini-swe-agent (OpenAI,
# text only) in the fast suite; the other cells (each a few seconds) with the slow tests
FAST = {"claude-code", "mini-swe-agent"}
SCAFFOLDS = [
    pytest.param(s.scaffold, marks=() if s.scaffold in FAST else pytest.mark.slow)
    for s in scenarios()
]


@pytest.fixture(scope="module")
def matrix():
    from slr_testkit.fidelity.engines import close_all, matrix_engines

    engines, score = matrix_engines(
        {
            "chatml": None,  # SmolLM2's own template
            "qwen3": (TEMPLATES / "qwen3_style.jinja").read_text(),
            "llama3": (TEMPLATES / "llama3_style.jinja").read_text(),
        }
    )
    yield engines, score
    asyncio.run(close_all(engines))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scaffold", SCAFFOLDS)
def test_cell(matrix, scaffold, family):
    """One scaffold under one template family: exact capture, fewest segments, re-scoring."""
    engines, score = matrix
    scenario = next(s for s in scenarios() if s.scaffold == scaffold)
    result = replay(scenario, family, engines[family], score)
    table = markdown_table([result], [family])
    assert result.error is None, table
    assert result.calls == len(scenario.calls)
    assert result.captured_mismatches == 0, table
    assert result.segments == result.minimum, table
    assert result.max_logprob_error <= 1e-4, table
    assert result.policy_tokens > 0
    if scaffold in ("mini-swe-agent", "terminus-2"):
        assert set(result.not_applicable) == {"tool calls", "sub-agent", "compaction"}
        # a Qwen3-style template drops earlier reasoning at each new user turn: every call
        # of a text-only scaffold then starts a segment; the others need one per session
        assert result.minimum == (len(scenario.calls) if family == "qwen3" else 1)
    else:
        assert not result.not_applicable
        # one conversation each for the main agent, its sub-agent and the compacted one
        assert result.minimum >= 3


class _OffByOne:
    """The engine, but reporting every log-prob 1e-3 too high: what a capture that lost
    track of the engine's numbers would look like."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_context = engine.max_context
        self.weights_version = engine.weights_version

    async def force_decode(self, prompt_ids, token_ids, sampling, *, session_id=None):
        from attrs import evolve

        gen = await self.engine.force_decode(prompt_ids, token_ids, sampling)
        return evolve(gen, logprobs=[x + 1e-3 for x in gen.logprobs])


@pytest.mark.timeout(120)
def test_the_checks_catch_a_wrong_capture(matrix):
    engines, score = matrix
    mini = next(s for s in scenarios() if s.scaffold == "mini-swe-agent")
    result = replay(mini, "chatml", _OffByOne(engines["chatml"]), score)
    assert result.error is None and result.captured_mismatches == 0
    assert result.max_logprob_error > 5e-4 and not result.green()
