"""slr-backend-local: no daemon; one workspace folder per trial, isolated with bubblewrap."""

from __future__ import annotations

from typing import Literal

from attrs import frozen

import slr
from slr.config import option


@frozen(kw_only=True)
class LocalBackendConfig:
    isolation: Literal["auto", "bubblewrap", "none"] = option(
        "auto",
        doc="'bubblewrap' (required), 'none' (plain subprocesses, no isolation: warns), or "
        "'auto' (bubblewrap when installed, else none).",
    )
    workspace_dir: str | None = option(
        None, doc="Folder for the per-trial workspaces; default: a temporary folder."
    )
    cache_dir: str | None = option(
        None,
        doc="Folder for the prepared task environments, keyed by content hash; default: "
        "~/.cache/slr/local-envs.",
    )
    rootfs: Literal["host", "image", "auto"] = option(
        "host",
        doc="What a sandbox's / is built from: 'image' (the task's FROM image, unpacked from "
        "the docker image store or the OCI layout; the Dockerfile's steps run in it, as docker "
        "would), 'host' (this machine's /usr, read-only, with the Dockerfile's steps replayed "
        "on it: needs no image), or 'auto' (image when the FROM image is in a local store, "
        "else host). See docs/sandboxes.md.",
    )
    images_dir: str | None = option(
        None,
        doc="Folder for unpacked FROM images (rootfs = 'image'), keyed by image digest and "
        "shared by every cache_dir; default: ~/.cache/slr/local-images.",
    )
    oci_layout: str | None = option(
        None,
        doc="An OCI image layout to find FROM images in when no docker daemon has them "
        "(tag: the reference with every character but letters, digits, '.', '_', '-' "
        "as '_'); default: ~/.cache/slr/oci when it exists.",
    )
    root_copy: Literal["auto", "overlay", "copy"] = option(
        "auto",
        doc="How each trial gets its own copy of an image root (rootfs = 'image'): 'overlay' "
        "(an overlayfs upper layer: needs root), 'copy' (cp -a), or 'auto' (overlay where it "
        "mounts).",
    )
    proxy_port: int = option(
        47110, doc="Port on the sandbox's loopback where the agent reaches the proxy."
    )
    unsafe_host_paths: bool = option(
        False,
        doc="Without bubblewrap, start sandboxes anyway: commands run directly on this machine "
        "and a task's absolute paths (/app, /tests, /logs) are this machine's own. For "
        "debugging trusted tasks only.",
    )
    limits: Literal["auto", "rlimits", "off"] = option(
        "auto",
        doc="Resource limits of each sandbox (under bubblewrap): 'auto' (control groups for "
        "processes and memory where this machine lets slr make them, rlimits for the rest), "
        "'rlimits' (rlimits only), or 'off'. Memory and file size come from the task's "
        "[environment] memory_mb and storage_mb; see docs/sandboxes.md.",
    )
    pids_limit: int = option(4096, doc="Most processes one sandbox may hold (fork-bomb guard).")
    open_files: int = option(4096, doc="Most files one process of a sandbox may hold open.")
    python: str = option(
        "/usr/bin/python3",
        doc="Host python3 (under /usr, so it is visible in the sandbox) that runs the relay.",
    )


@slr.hookimpl
def register_sandbox_backends(register):
    register("local", "slr_backend_local.backend:LocalBackend", config_cls=LocalBackendConfig)


@slr.hookimpl
def register_preflight_checks(register):
    from slr_backend_local.preflight import check_image_sources, check_isolation

    register("local-isolation", check_isolation, stage="machine")
    register("local-images", check_image_sources, stage="machine")
