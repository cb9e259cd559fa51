"""slr-backend-docker: one Docker container per trial, local or remote daemon."""

from __future__ import annotations

from attrs import frozen

import slr
from slr.config import option


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
    socket_dir: str | None = option(
        None,
        doc="Host folder for the per-trial proxy sockets (must be visible to the daemon); "
        "default: a temporary folder.",
    )


@slr.hookimpl
def register_sandbox_backends(register):
    register("docker", "slr_backend_docker.backend:DockerBackend", config_cls=DockerBackendConfig)


@slr.hookimpl
def register_preflight_checks(register):
    from slr_backend_docker.preflight import check_daemon, check_images

    register("docker-daemon", check_daemon, stage="machine")
    register("docker-images", check_images, stage="data")


@slr.hookimpl
def register_commands(cli):
    from slr_backend_docker.commands import images

    cli.add_command(images)
