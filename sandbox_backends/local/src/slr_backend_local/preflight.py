"""The local backend's preflight: bubblewrap is there when the config relies on it, and a
source of task images (a docker daemon, or an OCI layout and umoci) when it runs them."""

from __future__ import annotations

import shutil
from pathlib import Path

from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr_backend_local.isolation import bwrap_path

DOC = "docs/troubleshooting/sandboxes.md#no-bubblewrap"
DOC_IMAGES = "docs/sandboxes.md#task-images-on-the-local-backend"


def check_isolation(ctx: Context) -> CheckResult | None:
    if not ctx.uses("backend", "local"):
        return None
    options = ctx.options("backend")
    found = bwrap_path()
    if found is not None and options.isolation != "none":
        return ok(f"bubblewrap at {found}: each trial runs in its own namespaces")
    if options.isolation == "bubblewrap":
        return fatal(
            "backend.isolation = 'bubblewrap' but bwrap is not installed",
            fix="apt-get install bubblewrap, or use --backend docker",
            doc=DOC,
        )
    if not options.unsafe_host_paths:
        return fatal(
            "the local backend has no isolation here (no bubblewrap, or isolation = 'none'), "
            "so it refuses to start sandboxes: a task's /app and /logs would be this machine's",
            fix="apt-get install bubblewrap, use --backend docker, or (trusted tasks only) set "
            "backend.unsafe_host_paths = true",
            doc=DOC,
        )
    return warn(
        "no isolation: commands run directly on this machine (backend.unsafe_host_paths)",
        fix="install bubblewrap for real sandboxes",
        doc=DOC,
    )


def check_image_sources(ctx: Context) -> CheckResult | None:
    """``rootfs = "image"`` / ``"auto"``: where FROM images can come from, and how each trial
    gets its copy of one."""
    if not ctx.uses("backend", "local"):
        return None
    options = ctx.options("backend")
    if options.rootfs == "host":
        return None
    from slr_backend_local.rootfs import ImageStores, default_oci_layout, overlay_supported

    layout = Path(options.oci_layout).expanduser() if options.oci_layout else default_oci_layout()
    stores = ImageStores(Path("."), layout)
    sources = []
    if stores.docker_available():
        sources.append("the docker image store")
    if layout is not None and (layout / "index.json").is_file():
        if shutil.which("umoci") is None:
            return fatal(
                f"backend.oci_layout {layout} holds images, but umoci is not installed to "
                f"unpack them",
                fix="apt-get install umoci",
                doc=DOC_IMAGES,
            )
        sources.append(f"the OCI layout {layout}")
    if not sources:
        message = (
            f"backend.rootfs = {options.rootfs!r} but no image store is reachable: no docker "
            f"daemon answers and no OCI layout is set up"
        )
        fix = (
            "start dockerd (images come from its store), or copy images into an OCI layout "
            "(apt-get install skopeo umoci; skopeo copy docker-archive:IMAGE.tar "
            "oci:LAYOUT:TAG) and set backend.oci_layout, or set backend.rootfs = 'host'"
        )
        if options.rootfs == "image":
            return fatal(message, fix=fix, doc=DOC_IMAGES)
        return warn(message + "; every task runs on the host's userland", fix=fix, doc=DOC_IMAGES)
    cache = Path(options.cache_dir or Path.home() / ".cache" / "slr" / "local-envs")
    if options.root_copy != "copy" and not overlay_supported(cache):
        if options.root_copy == "overlay":
            return fatal(
                "backend.root_copy = 'overlay' but this process cannot mount an overlay",
                fix="run as root on a kernel with overlayfs, or set backend.root_copy = 'auto'",
                doc=DOC_IMAGES,
            )
        return warn(
            f"images from {' and '.join(sources)}; no overlay mounts here, so every trial "
            f"copies its image's root (seconds per start)",
            fix="run as root on a kernel with overlayfs for cheap starts",
            doc=DOC_IMAGES,
        )
    return ok(f"task images from {' and '.join(sources)}; one overlay per trial")
