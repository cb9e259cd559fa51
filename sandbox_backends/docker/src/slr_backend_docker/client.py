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


def transport_errors() -> tuple[type[BaseException], ...]:
    """What the SDK lets through when the daemon stops answering (stopped, restarting, its
    socket closed mid-stream): the transport's own errors, which are no ``DockerException``."""
    import requests.exceptions

    return (requests.exceptions.RequestException, ConnectionError)


class DaemonUnreachable(SandboxError):
    """The docker daemon did not answer at all (as opposed to answering with an error)."""


def daemon_unreachable(base_url: str, call: object, exc: BaseException) -> DaemonUnreachable:
    return DaemonUnreachable(
        f"the docker daemon at {base_url} did not answer {getattr(call, '__name__', call)!s} "
        f"({type(exc).__name__}: {exc}); check `docker info` (a daemon restart ends the "
        f"trials it ran as infrastructure failures)"
    )
