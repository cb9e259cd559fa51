"""The fidelity matrix: scaffolds' sessions replayed through the proxy with forced decoding.

``scenarios()`` gives one recorded-shape session per scaffold; ``run_matrix`` replays each
under each chat-template family and checks the capture (``replay``'s docstring lists the
checks); ``markdown_table`` renders the result (docs/proxy.md holds the generated table).
"""

from slr_testkit.fidelity.replay import (
    CellResult,
    ForcedReplayEngine,
    family_tokenizers,
    markdown_table,
    replay,
    run_matrix,
)
from slr_testkit.fidelity.scenarios import Call, Conversation, Reply, Scenario, scenarios

__all__ = [
    "Call",
    "CellResult",
    "Conversation",
    "ForcedReplayEngine",
    "Reply",
    "Scenario",
    "family_tokenizers",
    "markdown_table",
    "replay",
    "run_matrix",
    "scenarios",
]
