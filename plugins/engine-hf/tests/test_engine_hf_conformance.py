"""The embedded engine passes the engine conformance suite, on the real SmolLM2."""

import pytest

from slr_testkit import EngineTests


@pytest.mark.slow
class TestHfEngineConformance(EngineTests):
    @pytest.fixture
    def engine(self, smollm2):
        return smollm2
