"""Pushing task images to a registry and pulling them back: one place for both backends.

``slr images build --push``, the docker backend's ``registry`` option and the k8s backend's
``image_load = "registry"`` all name an image the same way (``registry_ref``: the local tag
under the registry's prefix), so what one machine pushed another finds.
"""

from __future__ import annotations

from typing import Any

import structlog

from slr.contracts import SandboxError
from slr_backend_docker.tags import registry_ref

__all__ = ["RegistryError", "pull", "push", "registry_ref"]

log = structlog.get_logger()


class RegistryError(SandboxError):
    """A push to (or pull from) the registry failed; the message names the image and why."""


def _split(ref: str) -> tuple[str, str]:
    # the tag follows the last ":" after the last "/" (a registry's port also has a ":")
    repo, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return repo, tag


def push(api: Any, tag: str, registry: str) -> str:
    """Tag ``tag`` as ``registry/tag`` and push it; returns the pushed reference.

    ``api`` is the docker SDK's low-level client (``client.api``)."""
    import docker.errors

    ref = registry_ref(registry, tag)
    repo, version = _split(ref)
    try:
        api.tag(tag, repo, version)
        for chunk in api.push(repo, version, stream=True, decode=True):
            if "error" in chunk:
                raise RegistryError(
                    f"pushing {ref} failed: {str(chunk['error']).strip()}. Check that the "
                    f"registry {registry!r} answers and that you may push to it (docker login)"
                )
    except docker.errors.DockerException as exc:
        raise RegistryError(f"pushing {ref} failed: {exc}") from exc
    log.info("pushed image", image=ref)
    return ref


def pull(api: Any, tag: str, registry: str) -> bool:
    """Pull ``registry/tag`` and tag it ``tag`` locally; False when the registry lacks it.

    A registry that does not answer is a ``RegistryError``: the caller decides whether to
    build instead."""
    import docker.errors

    ref = registry_ref(registry, tag)
    repo, version = _split(ref)
    try:
        api.pull(repo, version)
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if "manifest unknown" in str(exc) or "not found" in str(exc).lower():
            return False
        raise RegistryError(f"pulling {ref} failed: {exc}") from exc
    except docker.errors.DockerException as exc:
        raise RegistryError(f"pulling {ref} failed: {exc}") from exc
    local_repo, local_version = _split(tag)
    api.tag(ref, local_repo, local_version)
    log.info("pulled image", image=ref)
    return True
