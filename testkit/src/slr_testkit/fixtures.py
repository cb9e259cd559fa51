"""pytest fixtures of the test kit (registered through its ``pytest11`` entry point)."""

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


@pytest.fixture(scope="session")
def sandbox_factory(tmp_path_factory):
    """For ``AgentAdapterTests``: ``await start(bundle)`` gives a fresh sandbox of a trivial
    task (workdir ``/app``) with ``bundle`` mounted where the trial runner mounts it.

    The backend is ``$SLR_TEST_BACKEND`` (default ``local``), from the installed plugins.
    Override this fixture to test on another backend or task.
    """
    import asyncio
    import os
    import uuid

    from slr.contracts import BUNDLE_MOUNT
    from slr.tasks import load_task

    folder = tmp_path_factory.mktemp("adapter-task")
    (folder / "environment").mkdir()
    (folder / "environment" / "Dockerfile").write_text("FROM slr-base:bookworm\nWORKDIR /app\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "instruction.md").write_text("Create hello.txt containing hello.\n")
    (folder / "task.toml").write_text('version = "1.0"\n[task]\nname = "slr/adapter-test"\n')
    task = load_task(folder)
    name = os.environ.get("SLR_TEST_BACKEND", "local")
    registration = get_plugin_manager().get("sandbox_backend", name)
    backend = registration.create(registration.config_cls() if registration.config_cls else None)

    async def start(bundle):
        return await backend.start(
            task,
            trial_id=f"adapter-test-{uuid.uuid4().hex[:8]}",
            labels={"slr.test": "adapter"},
            mounts={bundle.path: BUNDLE_MOUNT},
        )

    yield start
    asyncio.run(backend.close())


@pytest.fixture(scope="session")
def ray_cluster():
    """A Ray cluster simulated on this machine (``slr_testkit.ray_cluster``): a head plus two
    ``engine`` nodes (1 CPU and resource ``engine = 1`` each) and a ``sandbox`` node (1 CPU,
    ``sandbox = 2``), all on 127.0.0.1, with this process connected. One per test session:
    it takes seconds to start. Yields a ``SimulatedCluster`` (``address``, ``nodes``,
    ``node_ids(role)``)."""
    from slr_testkit.ray_cluster import simulated_cluster

    with simulated_cluster() as cluster:
        yield cluster
