"""slr-backend-docker: one Docker container per trial, local or remote daemon."""

from __future__ import annotations

import slr
from slr_backend_docker.config import DockerBackendConfig

__all__ = ["DockerBackendConfig"]


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
