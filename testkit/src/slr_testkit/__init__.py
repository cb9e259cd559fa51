"""Test kit for plugin authors: fixtures and conformance suites.

``slr_plugins`` (a pytest fixture, loaded automatically through the ``pytest11`` entry
point) gives a fresh plugin manager for one test; ``slr_plugins.register(obj, name=...)``
adds an in-process plugin that is gone after the test. Backends, adapters and engines
subclass the conformance suites in ``slr_testkit.conformance``.
"""

from slr_testkit.conformance import (
    AgentAdapterTests,
    EngineTests,
    PrestartingAdapterTests,
    SandboxBackendTests,
    ScaffoldAdapterTests,
)
from slr_testkit.fixtures import PluginsForTest

__all__ = [
    "AgentAdapterTests",
    "EngineTests",
    "PluginsForTest",
    "PrestartingAdapterTests",
    "SandboxBackendTests",
    "ScaffoldAdapterTests",
]
