"""The local backend: no daemon. A task's Dockerfile is run once into a cached root (the
FROM image's own filesystem, or the host's userland: ``build.py``), each trial gets its own
copy of it as its workspace (an overlay or a copy), and every command runs in it under
bubblewrap (``isolation.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from slr.contracts import SandboxError
from slr.sandboxing import ProxyLink, pid_alive, remove_stale_links
from slr.sandboxing.cpu import SandboxCgroup, remove_stale_cgroups
from slr_backend_local import LocalBackendConfig
from slr_backend_local.build import META, Builder, Plan, Prepared
from slr_backend_local.isolation import bwrap_path, host_python_argv
from slr_backend_local.limits import Limits, SandboxLimits, remove_stale_groups
from slr_backend_local.rootfs import (
    ImageStores,
    copy_tree,
    default_oci_layout,
    mount_overlay,
    overlay_supported,
    remove_tree,
)
from slr_backend_local.sandbox import LocalSandbox, kill_workspace_processes

log = structlog.get_logger()

OWNER_FILE = "owner.json"


class LocalBackend:
    """``SandboxBackend`` on this machine, without a daemon."""

    def __init__(self, config: LocalBackendConfig | None = None) -> None:
        self.config = config or LocalBackendConfig()
        found = bwrap_path()
        if self.config.isolation == "bubblewrap" and found is None:
            raise SandboxError(
                "isolation = 'bubblewrap' but bwrap is not installed; install it "
                "(apt-get install bubblewrap) or set isolation = 'auto'"
            )
        self.bwrap = None if self.config.isolation == "none" else found
        if self.bwrap is None:
            log.warning(
                "local backend WITHOUT isolation: commands run as plain subprocesses on this "
                "machine, with its network and files; absolute paths in a task are this "
                "machine's own. Install bubblewrap for real sandboxes."
            )
        self.workspace_dir = Path(
            self.config.workspace_dir or Path(tempfile.gettempdir()) / "slr-local"
        )
        self.cache_dir = Path(
            self.config.cache_dir or Path.home() / ".cache" / "slr" / "local-envs"
        )
        self.stores = ImageStores(
            Path(self.config.images_dir or Path.home() / ".cache" / "slr" / "local-images"),
            _oci_layout(self.config.oci_layout),
        )
        self._builder_obj: Builder | None = None
        self._plans: dict[str, Plan] = {}  # content hash -> which root, for this backend's life
        # per event loop: an asyncio.Lock belongs to the loop that first waits on it
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    # -- prepared roots ------------------------------------------------------------------

    def _builder(self) -> Builder:
        if self._builder_obj is None:
            overlay = self.config.rootfs != "host" and (
                self.config.root_copy == "overlay"
                or (self.config.root_copy == "auto" and overlay_supported(self.cache_dir))
            )
            if self.config.root_copy == "overlay" and not overlay_supported(self.cache_dir):
                raise SandboxError(
                    "[backend] root_copy = 'overlay' but this process cannot mount an overlay "
                    "(it needs root and a kernel with overlayfs): set root_copy = 'auto'"
                )
            self._builder_obj = Builder(
                cache_dir=self.cache_dir,
                stores=self.stores,
                bwrap=self.bwrap,
                rootfs=self.config.rootfs,
                overlay=overlay,
            )
        return self._builder_obj

    async def prepare(self, task: Any) -> None:
        """Build the task's root once (cached by content hash)."""
        await self.prepared(task)

    async def prepared(self, task: Any) -> Prepared:
        """The task's built root (``build.Prepared``), building it on first use."""
        key = task.environment.content_hash
        plan = self._plans.get(key)
        if plan is None:
            plan = await asyncio.to_thread(self._builder().plan, task)
            self._plans[key] = plan
        folder = self.cache_dir / plan.key
        if (folder / META).is_file():
            return Prepared.load(folder)
        lock = self._locks.setdefault((id(asyncio.get_running_loop()), str(folder)), asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self._builder().build, task, plan)

    # -- sandboxes -----------------------------------------------------------------------

    async def start(
        self,
        task: Any,
        *,
        trial_id: str,
        labels: Mapping[str, str],
        mounts: Mapping[Path, str] | None = None,
    ) -> LocalSandbox:
        if not self.isolated and not self.config.unsafe_host_paths:
            raise SandboxError(
                "the local backend has no isolation here (bubblewrap is missing or isolation = "
                "'none'), so a task's absolute paths (/app, /tests, /logs) would be this "
                "machine's own and the verifier would wipe them. Install bubblewrap, use "
                "--backend docker, or set unsafe_host_paths = true for trusted tasks."
            )
        prepared = await self.prepared(task)
        relay_python: str | list[str] = self.config.python
        if not prepared.host_usr and not self.isolated:
            raise SandboxError(
                f"task {task.id}: an image root (rootfs = {self.config.rootfs!r}) runs only "
                f"under bubblewrap; install bubblewrap or set [backend] rootfs = 'host'"
            )
        if not prepared.host_usr:
            relay_python = prepared.python or host_python_argv(self.config.python) or ""
            if self.isolated and not relay_python:
                raise SandboxError(
                    f"task {task.id}: its image has no python3 for the proxy relay, and the "
                    f"host's ([backend] python = {self.config.python}) is not under /usr"
                )
        self.workspace_dir.mkdir(parents=True, exist_ok=True)
        ws = Path(tempfile.mkdtemp(prefix=f"{trial_id[:40]}-", dir=self.workspace_dir))
        (ws / OWNER_FILE).write_text(
            json.dumps({"pid": os.getpid(), "trial_id": trial_id, "labels": dict(labels)})
        )
        link = cgroup = limits = None
        # the copy is this sandbox's start cost, paid on a host thread: charged to it
        copy = asyncio.ensure_future(asyncio.to_thread(_timed_copy, prepared, ws))
        try:
            copy_cpu_s = await asyncio.shield(copy)
            if self.isolated:
                link = ProxyLink()
                link.start()
            cgroup = SandboxCgroup.create(f"{os.getpid()}-{ws.name}")
            limits = self._limits(task, f"{os.getpid()}-{ws.name}")
        except BaseException:
            # A cancel cannot stop the copy's thread: wait for it, or it would write into a
            # workspace removed under it (no owner file left, so no cleanup would ever find it).
            await asyncio.wait([copy])
            if link is not None:
                link.remove()
            if cgroup is not None:
                cgroup.remove()
            if limits is not None:
                limits.remove()
            remove_tree(ws)
            raise
        return LocalSandbox(
            bwrap=self.bwrap,
            python=relay_python,
            proxy_port=self.config.proxy_port,
            workspace=ws,
            workdir=prepared.workdir,
            env=prepared.env,
            host_usr=prepared.host_usr,
            link=link,
            mounts=dict(mounts or {}),
            cgroup=cgroup,
            limits=limits,
            start_cpu_s=copy_cpu_s,
        )

    def _limits(self, task: Any, name: str) -> SandboxLimits | None:
        """The sandbox's resource limits (``limits.py``); none without bubblewrap."""
        if not self.isolated or self.config.limits == "off":
            return None
        env = task.environment
        wanted = Limits(
            pids=self.config.pids_limit,
            memory_mb=env.memory_mb,
            file_size_mb=env.storage_mb,
            open_files=self.config.open_files,
        )
        return SandboxLimits.create(name, wanted, cgroups=self.config.limits == "auto")

    async def cleanup_orphans(self) -> int:
        """Remove workspaces and proxy link folders of dead processes; returns how many."""
        removed = remove_stale_links()
        remove_stale_cgroups(_owner_alive)
        remove_stale_groups(_owner_alive)
        if not self.workspace_dir.is_dir():
            return 0
        for ws in self.workspace_dir.iterdir():
            owner = ws / OWNER_FILE
            try:
                pid = json.loads(owner.read_text())["pid"]
            except (OSError, ValueError, KeyError):
                continue
            if pid_alive(pid):
                continue
            kill_workspace_processes(ws / "fs")
            remove_tree(ws)
            removed += 1
        return removed

    async def close(self) -> None:
        pass


def _timed_copy(prepared: Prepared, ws: Path) -> float:
    """Give a workspace its own root: an overlay over the prepared layers, or a copy;
    returns the CPU seconds this thread spent on it."""
    start = time.thread_time()
    if prepared.lowers:
        mount_overlay(list(prepared.lowers), ws / "upper", ws / "work", ws / "fs")
    elif prepared.host_usr:
        shutil.copytree(prepared.folder / "fs", ws / "fs", symlinks=True)
    else:
        copy_tree(prepared.folder / "fs", ws / "fs")
    return time.thread_time() - start


def _oci_layout(configured: str | None) -> Path | None:
    if configured:
        return Path(configured).expanduser()
    return default_oci_layout()


def _owner_alive(group: str) -> bool:
    """Whether the process that made cgroup ``<pid>-<workspace>`` still lives."""
    pid = group.split("-", 1)[0]
    return pid.isdigit() and pid_alive(int(pid))
