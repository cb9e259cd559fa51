"""The docker backend's preflight: the daemon answers, and this user may talk to it."""

from __future__ import annotations

import os

from slr.preflight import CheckResult, Context, fatal, ok

DOC = "docs/troubleshooting/sandboxes.md#docker-permission-denied"


def check_daemon(ctx: Context) -> CheckResult | None:
    if not ctx.uses("backend", "docker"):
        return None
    import docker
    import docker.errors

    base_url = ctx.options("backend").base_url
    where = base_url or os.environ.get("DOCKER_HOST") or "the local socket"
    try:
        client = (
            docker.DockerClient(base_url=base_url, timeout=10)
            if base_url
            else docker.from_env(timeout=10)
        )
        version = client.version().get("Version", "?")
        client.close()
    except docker.errors.DockerException as exc:
        text = str(exc)
        if "Permission denied" in text or "PermissionError" in text:
            return fatal(
                f"permission denied on the docker daemon at {where}",
                fix="add this user to the docker group (usermod -aG docker $USER, then log "
                "in again), or point DOCKER_HOST / backend.base_url at a daemon you may use",
                doc=DOC,
            )
        return fatal(
            f"no docker daemon answers at {where} ({text[:160]})",
            fix="start it (systemctl start docker, or `dockerd &`) and check `docker info`, "
            "or use --backend local",
            doc=DOC,
        )
    return ok(f"docker daemon {version} at {where}")
