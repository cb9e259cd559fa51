"""Task images' root filesystems for the local backend, with no daemon needed to run them.

A task's ``FROM`` image is found in a local image store and unpacked once per image digest
into a **base root** (``<images_dir>/<digest>/fs``, with the image's own ENV, WORKDIR and
USER in ``config.json``):

- the **docker** image store, when a daemon answers: the image's merged filesystem is
  exported through the docker SDK (a container is created, never started) and unpacked;
- an **OCI image layout** (``[backend] oci_layout``), with no daemon at all: the image
  tagged ``oci_tag(ref)`` there is unpacked with ``umoci`` (put one there with
  ``skopeo copy docker-archive:IMAGE.tar oci:LAYOUT:TAG``, or any OCI tool).

Trials and task builds then stack writable layers on a base root with **overlayfs** where
this machine lets ``slr`` mount it (root, a kernel with overlay), so neither a build nor a
trial copies the image: a build's changes are a layer of their own, and each trial gets a
fresh empty upper layer over them. Elsewhere they are copied (``cp -a``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import structlog
from attrs import frozen

from slr.contracts import SandboxError

log = structlog.get_logger()

CONFIG_FILE = "config.json"
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
_OCI_REF_NAME = "org.opencontainers.image.ref.name"


@frozen(kw_only=True)
class ImageConfig:
    """What the image itself sets for the processes it runs."""

    env: dict[str, str]
    workdir: str
    user: str

    def to_json(self) -> dict:
        return {"env": self.env, "workdir": self.workdir, "user": self.user}

    @classmethod
    def from_json(cls, data: dict) -> ImageConfig:
        return cls(env=dict(data["env"]), workdir=data["workdir"], user=data["user"])


@frozen(kw_only=True)
class BaseRoot:
    ref: str
    digest: str
    source: str  # "docker" | "oci"
    fs: Path
    config: ImageConfig


def default_oci_layout() -> Path | None:
    """``~/.cache/slr/oci`` when an OCI layout is there."""
    default = Path.home() / ".cache" / "slr" / "oci"
    return default if (default / "index.json").is_file() else None


def oci_tag(ref: str) -> str:
    """The tag an image reference has in an OCI layout: ``python:3.12-slim`` →
    ``python_3.12-slim`` (OCI tags allow only letters, digits, ``.``, ``_`` and ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", ref)


def _env_map(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        k, _, v = item.partition("=")
        out[k] = v
    return out


class ImageStores:
    """Finds an image by reference and unpacks it into a cached base root."""

    def __init__(self, images_dir: Path, oci_layout: Path | None, *, docker: bool = True):
        self.images_dir = images_dir
        self.oci_layout = oci_layout
        self._use_docker = docker
        self._docker_client = None
        self._docker_checked = False
        self._docker_lock = threading.Lock()
        self._unpack_lock = threading.Lock()

    # -- where an image is -----------------------------------------------------------------

    def _docker(self):
        if not self._use_docker:
            return None
        # trials prepare on threads: the first asks the daemon, the others wait for its answer
        with self._docker_lock:
            if not self._docker_checked:
                try:
                    import docker  # only where the docker SDK is installed

                    client = docker.from_env(timeout=60)
                    client.ping()
                    self._docker_client = client
                except Exception:  # no SDK, no daemon, no permission: this source is absent
                    self._docker_client = None
                self._docker_checked = True
        return self._docker_client

    def docker_available(self) -> bool:
        """Whether a docker daemon answers (the SDK installed, the socket reachable)."""
        return self._docker() is not None

    def _docker_image(self, ref: str):
        client = self._docker()
        if client is None:
            return None
        import docker.errors

        try:
            return client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker could not look up image {ref}: {exc}") from exc

    def _oci_digest(self, ref: str) -> str | None:
        if self.oci_layout is None:
            return None
        index = self.oci_layout / "index.json"
        try:
            manifests = json.loads(index.read_text()).get("manifests", [])
        except (OSError, ValueError):
            return None
        tag = oci_tag(ref)
        for m in manifests:
            if (m.get("annotations") or {}).get(_OCI_REF_NAME) == tag:
                return m["digest"]
        return None

    def where(self, ref: str) -> tuple[str, str] | None:
        """``(source, digest)`` of the image ``ref`` in a local store, or None."""
        image = self._docker_image(ref)
        if image is not None:
            return "docker", str(image.id)
        digest = self._oci_digest(ref)
        if digest is not None:
            return "oci", digest
        return None

    def missing_message(self, ref: str) -> str:
        places = []
        places.append("the docker image store" if self._docker() else "no docker daemon")
        places.append(
            f"the OCI layout {self.oci_layout}" if self.oci_layout else "no [backend] oci_layout"
        )
        return (
            f"image {ref} is in no local image store (looked in {' and '.join(places)}): build or "
            f"load it into docker, or copy it into the OCI layout as tag {oci_tag(ref)} "
            f"(skopeo copy docker-archive:IMAGE.tar oci:LAYOUT:{oci_tag(ref)}); or set "
            f"[backend] rootfs = 'host' to replay the Dockerfile on this machine's userland"
        )

    # -- unpacking ----------------------------------------------------------------------

    def base_root(self, ref: str) -> BaseRoot:
        """The unpacked root of image ``ref``, unpacking it on first use."""
        found = self.where(ref)
        if found is None:
            raise SandboxError(self.missing_message(ref))
        source, digest = found
        folder = self.images_dir / digest.replace(":", "-")[:31]
        with self._unpack_lock:  # one unpack per image, however many trials ask at once
            if not (folder / CONFIG_FILE).is_file():
                self._unpack(ref, source, digest, folder)
        config = ImageConfig.from_json(json.loads((folder / CONFIG_FILE).read_text()))
        return BaseRoot(ref=ref, digest=digest, source=source, fs=folder / "fs", config=config)

    def _unpack(self, ref: str, source: str, digest: str, folder: Path) -> None:
        self.images_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=self.images_dir))
        try:
            if source == "docker":
                config = self._unpack_docker(ref, tmp / "fs")
            else:
                config = self._unpack_oci(ref, tmp)
            prepare_image_root(tmp / "fs")
            (tmp / CONFIG_FILE).write_text(
                json.dumps({"ref": ref, "digest": digest, **config.to_json()})
            )
            try:
                tmp.rename(folder)
            except OSError:
                if not (folder / CONFIG_FILE).is_file():  # not a concurrent unpacker's win
                    raise
        finally:
            remove_tree(tmp)
        log.info("image unpacked for the local backend", image=ref, source=source)

    def _unpack_docker(self, ref: str, dest: Path) -> ImageConfig:
        import docker.errors

        client = self._docker()
        assert client is not None
        image = client.images.get(ref)
        cfg = image.attrs.get("Config") or {}
        dest.mkdir(parents=True)
        try:
            # created, never started: its filesystem is the image's, merged
            container = client.containers.create(
                str(image.id), command=["/bin/true"], entrypoint=[]
            )
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker could not create a container of {ref}: {exc}") from exc
        try:
            _untar(container.export(chunk_size=1 << 20), dest, what=f"image {ref}")
        finally:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
        return ImageConfig(
            env=_env_map(cfg.get("Env")),
            workdir=cfg.get("WorkingDir") or "/",
            user=cfg.get("User") or "",
        )

    def _unpack_oci(self, ref: str, tmp: Path) -> ImageConfig:
        umoci = shutil.which("umoci")
        if umoci is None:
            raise SandboxError(
                f"image {ref} is in the OCI layout {self.oci_layout}, but umoci is not "
                f"installed to unpack it: apt-get install umoci"
            )
        bundle = tmp / "bundle"
        argv = [umoci, "unpack"]
        if os.geteuid() != 0:
            argv.append("--rootless")
        argv += ["--image", f"{self.oci_layout}:{oci_tag(ref)}", str(bundle)]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxError(f"umoci could not unpack {ref}: {proc.stderr.strip()[-800:]}")
        spec = json.loads((bundle / "config.json").read_text())
        process = spec.get("process") or {}
        (bundle / "rootfs").rename(tmp / "fs")
        user = process.get("user") or {}
        return ImageConfig(
            env=_env_map(process.get("env")),
            workdir=process.get("cwd") or "/",
            user=str(user.get("uid", "")) if user.get("uid") else "",
        )


def _untar(chunks, dest: Path, *, what: str) -> None:
    """Unpack a tar stream into ``dest`` with GNU tar (owners kept by number)."""
    tar = subprocess.Popen(
        ["tar", "-x", "--numeric-owner", "-p", "-C", str(dest), "--exclude=./dev/*", "-f", "-"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdin is not None and tar.stderr is not None
    try:
        for chunk in chunks:
            tar.stdin.write(chunk)
    except BrokenPipeError:
        pass
    finally:
        tar.stdin.close()
    err = tar.stderr.read().decode(errors="replace")
    if tar.wait() != 0:
        raise SandboxError(f"could not unpack {what}: tar: {err.strip()[-800:]}")


def prepare_image_root(fs: Path) -> None:
    """What a container runtime provides that an image does not hold: mount points, a
    ``/tmp`` anyone may write, and ``/etc/hosts``, ``hostname``, ``resolv.conf``."""
    for name in ("proc", "dev", "run", "tmp", "etc", "root"):
        path = fs / name
        if path.is_symlink():
            continue
        path.mkdir(exist_ok=True)
    if not (fs / "tmp").is_symlink():
        (fs / "tmp").chmod(0o1777)
    (fs / ".dockerenv").unlink(missing_ok=True)
    etc = fs / "etc"
    for name, text in (("hosts", HOSTS), ("hostname", "sandbox\n")):
        (etc / name).unlink(missing_ok=True)
        (etc / name).write_text(text)
    resolv = etc / "resolv.conf"
    resolv.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        shutil.copy2("/etc/resolv.conf", resolv)


# -- layers ----------------------------------------------------------------------------------


def overlay_supported(scratch: Path) -> bool:
    """Whether this process can mount an overlay here (root, a kernel with overlayfs, a
    filesystem that can hold its upper layer)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    scratch.mkdir(parents=True, exist_ok=True)
    probe = Path(tempfile.mkdtemp(prefix=".overlay-probe-", dir=scratch))
    try:
        for name in ("lower", "upper", "work", "fs"):
            (probe / name).mkdir()
        try:
            mount_overlay([probe / "lower"], probe / "upper", probe / "work", probe / "fs")
        except SandboxError:
            return False
        unmount(probe / "fs")
        return True
    finally:
        remove_tree(probe)


def mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount ``upper`` (writable) over ``lowers`` (topmost first) at ``target``."""
    for path in (upper, work, target):
        path.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
    proc = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(target)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SandboxError(f"cannot mount an overlay at {target}: {proc.stderr.strip()}")


def unmount(target: Path) -> None:
    """Unmount ``target`` if something is mounted there (lazily: a process still exiting
    keeps it busy for a moment, and must not keep the workspace)."""
    if os.path.ismount(target):
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def remove_tree(path: Path) -> None:
    """Remove a workspace or build folder, unmounting what is mounted in it first."""
    if not path.exists():
        return
    for name in ("fs",):
        unmount(path / name)
    shutil.rmtree(path, ignore_errors=True)


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a root as is (owners, modes, links, special files): ``cp -a``."""
    proc = subprocess.run(
        ["cp", "-a", "--reflink=auto", str(src), str(dest)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SandboxError(f"cannot copy {src} to {dest}: {proc.stderr.strip()[-800:]}")
