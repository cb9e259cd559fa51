"""The docker backend's preflight: the daemon answers, this user may talk to it, and the
tasks' images are there or can be built from images the daemon has."""

from __future__ import annotations

import os
from pathlib import Path

from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr_backend_docker.base_image import BASE_TAG

DOC = "docs/troubleshooting/sandboxes.md#docker-permission-denied"
DOC_IMAGES = "docs/troubleshooting/sandboxes.md#task-image-cannot-be-built"


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


def from_images(dockerfile: Path) -> list[str]:
    """The images a Dockerfile builds FROM (not its own stages, not ``scratch``; a name
    with a build argument in it cannot be known ahead and is left out)."""
    stages: set[str] = set()
    bases: list[str] = []
    for raw in dockerfile.read_text(errors="replace").splitlines():
        words = raw.split()
        if len(words) < 2 or words[0].upper() != "FROM":
            continue
        words = [w for w in words[1:] if not w.startswith("--")]
        if not words:
            continue
        image = words[0]
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if image.lower() in stages or image == "scratch" or "$" in image:
            continue
        if image not in bases:
            bases.append(image)
    return bases


def check_images(ctx: Context) -> CheckResult | None:
    """Each task's image is on the daemon, or buildable from images the daemon has."""
    if not ctx.uses("backend", "docker"):
        return None
    import docker.errors

    from slr.errors import SlrError
    from slr.tasks import load_tasks
    from slr_backend_docker.client import connect
    from slr_backend_docker.tags import image_tag

    cfg, options = ctx.config, ctx.options("backend")
    try:
        tasks = load_tasks(cfg.tasks.path, include=cfg.tasks.include, split=cfg.tasks.split)
    except SlrError:
        return None  # the tasks check reports it
    client = connect(options.base_url, timeout=30)
    try:
        tags = {tag for image in client.images.list() for tag in image.tags}
        to_build = [t for t in tasks if image_tag(options.image_prefix, t) not in tags]
        prebuilt = [t for t in to_build if t.environment.docker_image]
        needs: dict[str, list[str]] = {}
        for t in to_build:
            if not t.environment.docker_image:
                for base in from_images(t.environment.dockerfile):
                    needs.setdefault(base, []).append(t.id)
        absent = {}
        for base, ids in needs.items():
            try:
                client.images.get(base)
            except docker.errors.ImageNotFound:
                absent[base] = ids
    finally:
        client.close()
    if BASE_TAG in absent:
        ids = absent[BASE_TAG]
        return fatal(
            f"{len(ids)} task(s) build FROM {BASE_TAG} ({', '.join(ids[:3])}), which is not on "
            f"the docker daemon and is in no registry",
            fix="build it once: `slr images base`",
            doc=DOC_IMAGES,
        )
    pulls = sorted(absent) + sorted({t.environment.docker_image or "" for t in prebuilt})
    if pulls:
        return warn(
            f"the daemon must pull {', '.join(pulls[:4])} for {len(to_build)} task image(s) "
            f"(a machine with no registry access cannot)",
            fix=f"docker pull (or docker load) {pulls[0]} ahead, then build the task images "
            f"with `slr images build`",
            doc=DOC_IMAGES,
        )
    built = len(tasks) - len(to_build)
    return ok(
        f"{built} of {len(tasks)} task image(s) on the daemon; the other {len(to_build)} "
        f"build from local images at their first trial"
        + (" (or ahead, all at once: `slr images build TASKS -j 4`)" if to_build else "")
    )
