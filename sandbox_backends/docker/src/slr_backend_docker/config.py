"""``[backend]`` options of the docker backend (``name = "docker"``). Imported without the SDK."""

from __future__ import annotations

from attrs import frozen

from slr.config import option


def check_registry(value: str, name: str = "registry") -> None:
    """A registry prefix is ``host[:port][/path]``, as in an image name: no scheme, no tag."""
    if "://" in value or value.strip().endswith(":"):
        raise ValueError(
            f"{name} = {value!r} is not a registry prefix: write host[:port][/path] "
            f"(e.g. 'registry.example.com:5000/slr'), without http:// and without a tag"
        )


def _registry(_instance, attribute, value: str) -> None:
    check_registry(value, attribute.name)


@frozen(kw_only=True)
class DockerBackendConfig:
    base_url: str | None = option(
        None, doc="Docker daemon URL (e.g. unix:///var/run/docker.sock); default: DOCKER_HOST."
    )
    image_prefix: str = option("slr-task", doc="Repository prefix of the per-task images.")
    proxy_port: int = option(
        47110, doc="Port on the sandbox's loopback where the agent reaches the proxy."
    )
    pids_limit: int = option(4096, doc="Most processes one sandbox may hold (fork-bomb guard).")
    open_files: int = option(
        4096, doc="Most files one process of a sandbox may hold open (its nofile ulimit)."
    )
    daemon_wait_s: float = option(
        120.0,
        doc="How long a sandbox start waits for a docker daemon that does not answer "
        "(restarting) to come back before the trial fails as sandbox_error; 0: no wait.",
    )
    exec_server: bool = option(
        True,
        doc="Run the agent phase's commands through a small exec server in the container's "
        "PID 1 instead of the daemon's exec API (which completes ~15 commands a second on two "
        "cores, whatever the number of sandboxes); the verifier phase always uses the daemon. "
        "false: every command through the daemon.",
    )
    registry: str = option(
        "",
        doc="Registry prefix shared by machines that build task images (e.g. "
        "'registry.example.com:5000/slr'): a missing image is pulled from "
        "<registry>/<tag> before it is built, and one built here is pushed there. '' = none.",
        validator=_registry,
    )
    socket_dir: str | None = option(
        None,
        doc="Host folder for the per-trial proxy sockets (must be visible to the daemon); "
        "default: a temporary folder.",
    )
