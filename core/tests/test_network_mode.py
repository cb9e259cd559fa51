"""Network modes are checked once, where a value comes in; sandboxes take the typed value."""

from __future__ import annotations

import pytest

from slr.contracts import NETWORK_MODES, network_mode
from slr.tasks import VerifierSettings


def test_every_mode_passes_as_itself():
    assert [network_mode(m) for m in NETWORK_MODES] == ["proxy-only", "none", "full"]


@pytest.mark.parametrize("value", ["bridge", "None", None, ""])
def test_an_unknown_mode_names_the_value_and_the_choices(value):
    with pytest.raises(
        ValueError, match=r"network mode .*: expected one of proxy-only, none, full"
    ):
        network_mode(value)


def test_the_verifier_phase_cannot_ask_for_the_agent_phases_mode():
    assert VerifierSettings(network="none").network == "none"
    with pytest.raises(ValueError, match="'proxy-only': expected one of full, none"):
        VerifierSettings(network="proxy-only")
