"""Fixtures shared by the adapter tests (``tests/adapters`` and each adapter's own
``tests/``, whose conftest.py imports them): the real sandbox backends, the example task.

Every adapter test runs its scaffold in a real sandbox of each backend: ``docker`` (the
task's image, which has no Node, no Python 3.12 and no tmux: all of it comes from the
bundle) and ``local`` (bubblewrap over the host's /usr). The bundle is mounted read-only
where the trial runner mounts it, and the sandbox reaches nothing but the endpoint.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker.backend import DockerBackend
from slr_backend_docker.base_image import BASE_TAG
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend

from slr.contracts import BUNDLE_MOUNT
from slr.sandboxing.labels import OWNER_PID, SANDBOX
from slr.tasks import load_task

__all__ = ["backend_name", "docker_backend", "hello_task", "local_backend", "sandbox_factory"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"


@pytest.fixture(scope="session")
def hello_task():
    return load_task(EXAMPLES / "hello-world")


@pytest.fixture(scope="session")
def docker_backend():
    b = DockerBackend(DockerBackendConfig())
    assert b.client.images.get(BASE_TAG), f"run `slr images base` first ({BASE_TAG})"
    yield b
    leftovers = [
        c.name
        for c in b.client.containers.list(all=True, filters={"label": SANDBOX})
        if c.labels.get(OWNER_PID) == str(os.getpid())
    ]
    asyncio.run(b.close())
    assert leftovers == [], f"containers left behind: {leftovers}"


@pytest.fixture(scope="session")
def local_backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters-local")
    b = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap", workspace_dir=str(root / "ws"), cache_dir=str(root / "cache")
        )
    )
    yield b
    asyncio.run(b.close())


@pytest.fixture(scope="session", params=["docker", "local"])
def backend_name(request):
    return request.param


@pytest.fixture(scope="session")
def sandbox_factory(backend_name, request, hello_task):
    backend = request.getfixturevalue(f"{backend_name}_backend")

    async def start(bundle):
        return await backend.start(
            hello_task,
            trial_id=f"adapter-test-{uuid.uuid4().hex[:8]}",
            labels={"slr.test": "adapters"},
            mounts={bundle.path: BUNDLE_MOUNT},
        )

    return start
