"""The core's own model-free agents: registered by slr-core itself, and conformant."""

from __future__ import annotations

import pytest

from slr.agents.model_free import NopAgent, OracleAgent
from slr.plugins import BUILTIN_PLUGINS, PluginManager
from slr_testkit import AgentAdapterTests


class TestOracleConformance(AgentAdapterTests):
    @pytest.fixture
    def adapter(self):
        return OracleAgent()


class TestNopConformance(AgentAdapterTests):
    @pytest.fixture
    def adapter(self):
        return NopAgent()


def test_a_manager_without_entry_points_has_them_attributed_to_slr_core():
    manager = PluginManager(load_entry_points=False)
    agents = manager.registry("agent")
    assert {"oracle", "nop"} <= set(agents)
    assert agents["oracle"].plugin.distribution == "slr-core"
    assert isinstance(manager.get("agent", "oracle").create(), OracleAgent)
    assert isinstance(manager.get("agent", "nop").create(), NopAgent)
    assert set(BUILTIN_PLUGINS) <= set(manager.plugins)


def test_the_entry_point_allowlist_does_not_drop_them(monkeypatch):
    monkeypatch.setenv("SLR_LOAD_PLUGINS", "")
    manager = PluginManager()
    assert {"oracle", "nop"} <= set(manager.registry("agent"))


def test_a_manager_can_be_built_without_them():
    manager = PluginManager(load_entry_points=False, load_builtins=False)
    assert manager.registry("agent") == {}
