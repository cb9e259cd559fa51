"""Prepared task roots: a task's Dockerfile run once into a root, cached by content hash.

Two kinds of root (``[backend] rootfs``):

- **image**: the ``FROM`` image's own filesystem (``rootfs.py``), with the steps run in it
  under bubblewrap as ``docker build`` would run them (network on, the image's tools, its
  ENV). Cached under a key over the environment's content hash, the base image's digest
  and the build arguments. With overlayfs the build's changes are a layer of their own over
  the shared base (``layer/``); without it the root is a full copy (``fs/``).
- **host**: this machine's ``/usr`` bound read-only and a private ``/etc`` (``isolation``),
  with the steps replayed on top (``RUN`` without network, with the host's tools). Cached
  under the content hash alone, as before image roots existed.

Files a ``COPY`` brings in are staged on the host, then copied by ``cp -a`` *inside* the
sandbox: a path in an image (``/app`` a symlink to ``/etc``) resolves inside its root, never
on this machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from attrs import frozen

from slr.contracts import SandboxError
from slr_backend_local import dockerfile as df
from slr_backend_local.isolation import BASE_ENV, bwrap_argv, make_root
from slr_backend_local.rootfs import (
    BaseRoot,
    ImageStores,
    copy_tree,
    mount_overlay,
    remove_tree,
    unmount,
)

log = structlog.get_logger()

META = "meta.json"
_STAGE = "/.slr-copy"


@frozen(kw_only=True)
class Plan:
    key: str
    rootfs: str  # "image" | "host"
    dockerfile: df.Dockerfile | None
    base: BaseRoot | None


@frozen(kw_only=True)
class Prepared:
    """A built task root, as ``meta.json`` describes it."""

    folder: Path
    rootfs: str
    workdir: str
    env: dict[str, str]
    python: str | None
    """The python3 that runs the proxy relay inside (image roots: the image's own)."""
    lowers: tuple[Path, ...]
    """Overlay layers, topmost first; empty: ``folder/fs`` is the root each trial copies."""

    @property
    def host_usr(self) -> bool:
        return self.rootfs == "host"

    @classmethod
    def load(cls, folder: Path) -> Prepared:
        meta = json.loads((folder / META).read_text())
        return cls(
            folder=folder,
            rootfs=meta.get("rootfs", "host"),
            workdir=meta["workdir"],
            env=meta["env"],
            python=meta.get("python"),
            lowers=tuple(Path(p) for p in meta.get("lowers", [])),
        )


class Builder:
    def __init__(
        self,
        *,
        cache_dir: Path,
        stores: ImageStores,
        bwrap: str | None,
        rootfs: str,
        overlay: bool,
    ) -> None:
        self.cache_dir = cache_dir
        self.stores = stores
        self.bwrap = bwrap
        self.rootfs = rootfs
        self.overlay = overlay

    # -- which root ----------------------------------------------------------------------

    def plan(self, task: Any) -> Plan:
        env = task.environment
        dockerfile = None
        if env.dockerfile.is_file():
            try:
                dockerfile = df.parse(env.dockerfile)
                dockerfile.steps({})  # what needs a real build fails here, before any unpack
            except df.UnsupportedDockerfile as exc:
                raise SandboxError(
                    f"task {task.id} cannot run on the local backend: {exc}"
                ) from exc
        ref = dockerfile.base if dockerfile is not None else env.docker_image
        base = None
        if self.rootfs != "host" and ref and ref != "scratch":
            if self.rootfs == "image" or self.stores.where(ref) is not None:
                base = self.stores.base_root(ref)
        if base is None:
            if dockerfile is None:
                raise SandboxError(
                    f"task {task.id} names a prebuilt image ({env.docker_image}) and no "
                    f"Dockerfile; with [backend] rootfs = 'host' the local backend cannot run "
                    f"it: set rootfs = 'image' (with the image in a local store) or use docker"
                )
            return Plan(key=env.content_hash[:24], rootfs="host", dockerfile=dockerfile, base=None)
        h = hashlib.sha256(
            json.dumps(["image", env.content_hash, base.digest, self.overlay]).encode()
        )
        return Plan(
            key=f"img-{h.hexdigest()[:20]}", rootfs="image", dockerfile=dockerfile, base=base
        )

    # -- building ------------------------------------------------------------------------

    def build(self, task: Any, plan: Plan) -> Prepared:
        folder = self.cache_dir / plan.key
        if (folder / META).is_file():
            return Prepared.load(folder)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=self.cache_dir))
        try:
            meta = self._build_into(task, plan, tmp, folder)
            remove_tree_mount(tmp)
            shutil.rmtree(tmp / "work", ignore_errors=True)
            (tmp / META).write_text(json.dumps(meta))
            try:
                tmp.rename(folder)
            except OSError:
                if not (folder / META).is_file():  # not a concurrent builder's win
                    raise
        finally:
            remove_tree(tmp)
        return Prepared.load(folder)

    def _build_into(self, task: Any, plan: Plan, tmp: Path, final: Path) -> dict:
        env = task.environment
        root = tmp / "fs"
        image = plan.base is not None
        lowers: list[str] = []
        if plan.base is not None:
            if self.overlay:
                mount_overlay([plan.base.fs], tmp / "layer", tmp / "work", root)
                lowers = [str(final / "layer"), str(plan.base.fs)]
            else:
                copy_tree(plan.base.fs, root)
            image_env = {"PATH": BASE_ENV["PATH"], **plan.base.config.env}
            workdir = plan.base.config.workdir or "/"
        else:
            make_root(root)
            image_env = {"PATH": BASE_ENV["PATH"]}
            workdir = "/"
        envs = dict(image_env)
        steps = plan.dockerfile.steps(image_env) if plan.dockerfile is not None else []
        for step in steps:
            if step.op == "WORKDIR":
                workdir = step.args[0]
                self._mkdir(task, root, workdir, image=image)
            elif step.op == "ENV":
                for kv in step.args:
                    name, _, value = kv.partition("=")
                    envs[name] = value
            elif step.op == "COPY":
                self._copy(task, env.path, root, workdir, step, image=image)
            elif step.op == "RUN":
                self._run(task, root, workdir, dict(step.env), step, image=image)
        final_env = {**envs, **env.env}
        final_workdir = env.workdir or workdir
        self._mkdir(task, root, final_workdir, image=image)
        return {
            "rootfs": plan.rootfs,
            "workdir": final_workdir,
            "env": final_env,
            "python": _find_python(root, final_env.get("PATH", "")) if image else None,
            "lowers": lowers,
            "base": plan.base.ref if plan.base is not None else None,
            "base_digest": plan.base.digest if plan.base is not None else None,
        }

    def _sandboxed(
        self,
        task: Any,
        root: Path,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        image: bool,
        what: str,
        mounts: Mapping[Path, str] | None = None,
    ) -> None:
        if self.bwrap is None:
            raise SandboxError(
                f"task {task.id}: {what} runs a command, which the local backend does only "
                f"under bubblewrap; install bubblewrap or use docker"
            )
        a = bwrap_argv(
            self.bwrap,
            root,
            list(argv),
            cwd=cwd,
            env=env,
            # an image build has the network, as docker build does; host replays never had
            network=image,
            link_dir=None,
            mounts=mounts,
            host_usr=not image,
        )
        try:
            proc = subprocess.run(
                a, capture_output=True, text=True, timeout=task.environment.build_timeout_s
            )
        except subprocess.TimeoutExpired:
            raise SandboxError(
                f"task {task.id}: {what} ran past the build timeout "
                f"({task.environment.build_timeout_s:g} s, [environment] build_timeout_sec)"
            ) from None
        if proc.returncode != 0:
            hint = (
                ""
                if image
                else ". The host may lack a tool the image would have: set "
                "[backend] rootfs = 'image' or use --backend docker"
            )
            raise SandboxError(
                f"task {task.id}: {what} failed on the local backend with exit "
                f"{proc.returncode}: {(proc.stderr or proc.stdout).strip()[-1500:]}{hint}"
            )

    def _mkdir(self, task: Any, root: Path, path: str, *, image: bool) -> None:
        if not image:
            (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            return
        self._sandboxed(
            task, root, ["mkdir", "-p", path], cwd="/", env={}, image=True, what=f"mkdir {path}"
        )

    def _copy(
        self, task: Any, context: Path, root: Path, workdir: str, step: df.Step, *, image: bool
    ) -> None:
        *srcs, dest = step.args
        dest_inner = posixpath.normpath(posixpath.join(workdir, dest))
        many = len(srcs) > 1 or dest.endswith("/")
        stage = Path(tempfile.mkdtemp(prefix=".copy-", dir=self.cache_dir))
        try:
            files = stage / "files"
            files.mkdir()
            # what lands in the destination folder (into) or, for one file, the file itself
            single: Path | None = None
            ctx = context.resolve()
            for src in srcs:
                matches = sorted(ctx.glob(src)) if any(c in src for c in "*?[") else [ctx / src]
                for path in matches:
                    real = path.resolve()
                    if real != ctx and ctx not in real.parents:
                        raise SandboxError(
                            f"{step_where(task, step)}: COPY source {src} is outside the "
                            f"build context"
                        )
                    if not path.exists():
                        raise SandboxError(f"{step_where(task, step)}: COPY source {src} not found")
                    if path.is_dir():
                        shutil.copytree(path, files, symlinks=True, dirs_exist_ok=True)
                    elif step.add and tarfile.is_tarfile(path):
                        with tarfile.open(path) as tf:
                            tf.extractall(files, filter="tar")
                    elif many:
                        shutil.copy2(path, files / path.name)
                    else:
                        single = path
            if single is not None and not any(files.iterdir()):
                script = (
                    'if [ -d "$1" ]; then cp -a "$2" "$1/$3"; '
                    'else mkdir -p "$(dirname "$1")" && cp -a "$2" "$1"; fi'
                )
                argv = ["sh", "-c", script, "sh", dest_inner, f"{_STAGE}/one", single.name]
                shutil.copy2(single, stage / "one")
            else:
                if single is not None:
                    shutil.copy2(single, files / single.name)
                argv = [
                    "sh",
                    "-c",
                    'mkdir -p "$1" && cp -a "$2"/. "$1"/',
                    "sh",
                    dest_inner,
                    f"{_STAGE}/files",
                ]
            if not image:
                # host roots: /usr is the host's, and the root is slr's own fresh folder
                _host_copy(stage, root, dest_inner, single)
                return
            self._sandboxed(
                task,
                root,
                argv,
                cwd="/",
                env={},
                image=True,
                what=f"Dockerfile line {step.line} (COPY)",
                mounts={stage: _STAGE},
            )
            _remove_mount_point(root, _STAGE)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _run(
        self, task: Any, root: Path, workdir: str, env: dict, step: df.Step, *, image: bool
    ) -> None:
        shown = " ".join(step.args[2:] if step.args[:1] == ("/bin/sh",) else step.args)
        self._sandboxed(
            task,
            root,
            step.args,
            cwd=workdir,
            env=env,
            image=image,
            what=f"Dockerfile line {step.line} (RUN {shown})",
        )


def step_where(task: Any, step: df.Step) -> str:
    return f"task {task.id}: Dockerfile line {step.line}"


def _host_copy(stage: Path, root: Path, dest_inner: str, single: Path | None) -> None:
    target = root / dest_inner.lstrip("/")
    if single is not None and (stage / "one").exists():
        out = target / single.name if target.is_dir() else target
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(stage / "one", out)
    else:
        shutil.copytree(stage / "files", target, symlinks=True, dirs_exist_ok=True)


def _remove_mount_point(root: Path, inner: str) -> None:
    """bubblewrap made an empty folder in the root for a mount: take it out again."""
    path = root / inner.lstrip("/")
    if path.is_dir() and not path.is_symlink():
        try:
            path.rmdir()
        except OSError:
            pass


def _find_python(root: Path, path_var: str) -> str | None:
    for d in [*path_var.split(":"), "/usr/local/bin", "/usr/bin"]:
        if d.startswith("/") and os.path.lexists(root / d.lstrip("/") / "python3"):
            return posixpath.join(d, "python3")
    return None


def remove_tree_mount(tmp: Path) -> None:
    """Unmount a build's overlay (its changes stay in ``layer/``)."""
    unmount(tmp / "fs")
    if (tmp / "layer").is_dir():
        shutil.rmtree(tmp / "fs", ignore_errors=True)
