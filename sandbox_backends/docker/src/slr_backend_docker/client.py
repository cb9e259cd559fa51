"""Connecting to the docker daemon (local socket, or DOCKER_HOST for a remote one)."""

from __future__ import annotations

from slr.contracts import SandboxError


def connect(base_url: str | None = None, *, timeout: float = 120.0):
    import docker
    import docker.errors

    try:
        client = (
            docker.DockerClient(base_url=base_url, timeout=timeout)
            if base_url
            # docker's annotations say int; requests, which does the waiting, takes a float.
            else docker.from_env(timeout=timeout)  # pyright: ignore[reportArgumentType]
        )
        client.ping()
    except docker.errors.DockerException as exc:
        where = base_url or "DOCKER_HOST or the local socket"
        raise SandboxError(
            f"cannot reach the docker daemon at {where}: {exc}. Start it (e.g. `dockerd &`) "
            f"and check `docker info`, or use --backend local"
        ) from exc
    return client
