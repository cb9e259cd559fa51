"""Fixtures shared by the adapter tests: where scaffolds run."""

from __future__ import annotations

import pytest
from adapter_sandboxes import HostSubprocessSandboxStandIn


@pytest.fixture(scope="session")
def sandbox_factory():
    async def start(bundle):
        return HostSubprocessSandboxStandIn()

    return start
