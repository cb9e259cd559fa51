"""The local backend: no daemon. A task's Dockerfile is replayed once into a cached root
(see ``dockerfile.py`` for what can be), each trial gets a copy as its workspace, and every
command runs in it under bubblewrap (see ``isolation.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
import shutil
import subprocess
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
from slr_backend_local import dockerfile as df
from slr_backend_local.isolation import bwrap_argv, bwrap_path, make_root
from slr_backend_local.limits import Limits, SandboxLimits, remove_stale_groups
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
        # per event loop: an asyncio.Lock belongs to the loop that first waits on it
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    # -- prepared roots ------------------------------------------------------------------

    def _env_dir(self, task: Any) -> Path:
        return self.cache_dir / task.environment.content_hash[:24]

    async def prepare(self, task: Any) -> None:
        env_dir = self._env_dir(task)
        if (env_dir / "meta.json").is_file():
            return
        lock = self._locks.setdefault(
            (id(asyncio.get_running_loop()), str(env_dir)), asyncio.Lock()
        )
        async with lock:
            if (env_dir / "meta.json").is_file():
                return
            await asyncio.to_thread(self._build, task, env_dir)

    def _build(self, task: Any, env_dir: Path) -> None:
        env = task.environment
        if env.docker_image and not env.dockerfile.is_file():
            raise SandboxError(
                f"task {task.id} names a prebuilt image ({env.docker_image}); the local backend "
                f"cannot run images: use --backend docker"
            )
        try:
            steps = df.parse(env.dockerfile)
        except df.UnsupportedDockerfile as exc:
            raise SandboxError(f"task {task.id} cannot run on the local backend: {exc}") from exc
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=self.cache_dir))
        try:
            root = tmp / "fs"
            make_root(root)
            workdir, envs = "/", {}
            for step in steps:
                if step.op == "WORKDIR":
                    workdir = posixpath.normpath(posixpath.join(workdir, step.args[0]))
                    self._host(root, workdir).mkdir(parents=True, exist_ok=True)
                elif step.op == "ENV":
                    for kv in step.args:
                        key, value = kv.split("=", 1)
                        envs[key] = value
                elif step.op == "COPY":
                    self._copy(env.path, root, workdir, step)
                elif step.op == "RUN":
                    self._run(task, root, workdir, envs, step)
            meta = {"workdir": env.workdir or workdir, "env": {**envs, **env.env}}
            self._host(root, meta["workdir"]).mkdir(parents=True, exist_ok=True)
            (tmp / "meta.json").write_text(json.dumps(meta))
            try:
                tmp.rename(env_dir)
            except OSError:
                if not (env_dir / "meta.json").is_file():  # not a concurrent builder's win
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _host(root: Path, inner: str) -> Path:
        return root / inner.lstrip("/")

    def _copy(self, context: Path, root: Path, workdir: str, step: df.Step) -> None:
        *srcs, dest = step.args
        dest_inner = posixpath.join(workdir, dest)
        target = self._host(root, dest_inner)
        many = len(srcs) > 1 or dest.endswith("/")
        for src in srcs:
            matches = sorted(context.glob(src)) if any(c in src for c in "*?[") else [context / src]
            for path in matches:
                if not path.exists():
                    raise SandboxError(f"Dockerfile line {step.line}: COPY source {src} not found")
                if path.is_dir():
                    shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
                else:
                    out = target / path.name if many or target.is_dir() else target
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, out)

    def _run(self, task: Any, root: Path, workdir: str, envs: dict, step: df.Step) -> None:
        if self.bwrap is None:
            raise SandboxError(
                f"task {task.id}: Dockerfile line {step.line} RUNs a command, which the local "
                f"backend does only under bubblewrap; install bubblewrap or use docker"
            )
        argv = bwrap_argv(
            self.bwrap, root, list(step.args), cwd=workdir, env=envs, network=False, link_dir=None
        )
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=task.environment.build_timeout_s
        )
        if proc.returncode != 0:
            raise SandboxError(
                f"task {task.id}: Dockerfile line {step.line} (RUN {' '.join(step.args[2:])}) "
                f"failed on the local backend with exit {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-1500:]}. The host may lack a tool the "
                f"image would have: run this task with --backend docker"
            )

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
        await self.prepare(task)
        env_dir = self._env_dir(task)
        meta = json.loads((env_dir / "meta.json").read_text())
        self.workspace_dir.mkdir(parents=True, exist_ok=True)
        ws = Path(tempfile.mkdtemp(prefix=f"{trial_id[:40]}-", dir=self.workspace_dir))
        (ws / OWNER_FILE).write_text(
            json.dumps({"pid": os.getpid(), "trial_id": trial_id, "labels": dict(labels)})
        )
        link = cgroup = limits = None
        # the copy is this sandbox's start cost, paid on a host thread: charged to it
        copy = asyncio.ensure_future(asyncio.to_thread(_timed_copy, env_dir / "fs", ws / "fs"))
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
            shutil.rmtree(ws, ignore_errors=True)
            raise
        return LocalSandbox(
            bwrap=self.bwrap,
            python=self.config.python,
            proxy_port=self.config.proxy_port,
            workspace=ws,
            workdir=meta["workdir"],
            env=meta["env"],
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
            shutil.rmtree(ws, ignore_errors=True)
            removed += 1
        return removed

    async def close(self) -> None:
        pass


def _timed_copy(src: Path, dest: Path) -> float:
    """Copy a prepared root; returns the CPU seconds this thread spent on it."""
    start = time.thread_time()
    shutil.copytree(src, dest, symlinks=True)
    return time.thread_time() - start


def _owner_alive(group: str) -> bool:
    """Whether the process that made cgroup ``<pid>-<workspace>`` still lives."""
    pid = group.split("-", 1)[0]
    return pid.isdigit() and pid_alive(int(pid))
