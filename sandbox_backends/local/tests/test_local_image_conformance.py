"""The local backend with image roots (``rootfs = "image"``) against the same conformance
suite as every backend: the example tasks run in their FROM image's own root (from the docker
image store), one overlay per trial."""

from __future__ import annotations

import asyncio

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend

from slr_testkit import SandboxBackendTests

# ~25 s on a quiet 2-core machine once the base image is unpacked (~15 s more the first time)
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-image-backend")
    b = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            rootfs="image",
            workspace_dir=str(root / "ws"),
            cache_dir=str(root / "cache"),
        )
    )
    yield b
    asyncio.run(b.close())
    leftovers = [p.name for p in (root / "ws").iterdir()] if (root / "ws").exists() else []
    assert leftovers == [], f"workspaces left behind: {leftovers}"


class TestLocalImageConformance(SandboxBackendTests):
    pass
