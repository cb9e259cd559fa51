"""Helpers shared by the k8s backend tests (imported by name: pytest puts this folder on the path)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from service_readiness import K8S_NAMESPACE as NAMESPACE
from service_readiness import K8S_PY_IMAGE as PY_IMAGE

__all__ = ["NAMESPACE", "PY_IMAGE", "py_task", "run"]


def run(coro):
    return asyncio.run(coro)


def py_task(task_id: str = "py", **env) -> SimpleNamespace:
    """A task that runs the cluster's prebuilt python image (no image build)."""
    environment = SimpleNamespace(
        docker_image=PY_IMAGE,
        cpus=0.5,
        memory_mb=256,
        storage_mb=None,
        workdir=None,
        env={},
        content_hash="",
    )
    for key, value in env.items():
        setattr(environment, key, value)
    return SimpleNamespace(
        id=task_id,
        environment=environment,
        agent=SimpleNamespace(timeout_s=60.0),
        verifier=SimpleNamespace(timeout_s=60.0),
    )
