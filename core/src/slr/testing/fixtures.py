"""pytest fixtures shipped with slr-core (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slr.plugins import PluginManager, get_plugin_manager, set_plugin_manager


class PluginsForTest:
    """A plugin manager for one test: installed plugins plus the ones the test registers."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager

    def register(self, plugin: object, *, name: str, distribution: str | None = None) -> None:
        self.manager.register_plugin(plugin, name=name, distribution=distribution, version="test")


@pytest.fixture
def slr_plugins() -> Iterator[PluginsForTest]:
    previous = get_plugin_manager() if _has_manager() else None
    manager = PluginManager()
    set_plugin_manager(manager)
    try:
        yield PluginsForTest(manager)
    finally:
        set_plugin_manager(previous)


def _has_manager() -> bool:
    from slr import plugins

    return plugins._manager is not None
