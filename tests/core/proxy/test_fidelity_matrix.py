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

from slr.testing.fidelity import markdown_table, replay, scenarios

TEMPLATES = Path(__file__).parent / "templates"
FAMILIES = ("chatml", "qwen3", "llama3")
SCAFFOLDS = [s.scaffold for s in scenarios()]


@pytest.fixture(scope="module")
def matrix():
    from slr_engine_hf.fidelity import close_all, matrix_engines

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
    else:
        assert not result.not_applicable
        # one conversation each for the main agent, its sub-agent and the compacted one
        assert result.minimum >= 3


def test_a_template_that_drops_reasoning_costs_segments(matrix):
    """Qwen3-style templates drop earlier reasoning at a new user query: a text-only
    scaffold then needs a segment per turn, where ChatML needs one for the session."""
    engines, score = matrix
    mini = next(s for s in scenarios() if s.scaffold == "mini-swe-agent")
    chatml = replay(mini, "chatml", engines["chatml"], score)
    qwen3 = replay(mini, "qwen3", engines["qwen3"], score)
    assert chatml.segments == chatml.minimum == 1
    assert qwen3.segments == qwen3.minimum == len(mini.calls)
