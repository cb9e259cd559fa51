"""How one command runs in a local sandbox: the bubblewrap command line, or none.

The sandbox's root is the trial's workspace folder (writable, private). In a host-userland
root (``rootfs = "host"``) the host's ``/usr`` (and the merged-usr links ``/bin``, ``/lib``
... to it) is bound read-only, so the sandbox runs the host's tools but cannot change them,
and ``/etc`` is a private copy of the few host files programs need (no shadow, no keys). An
image root (``rootfs = "image"``) is the task image's own filesystem, ``/usr`` and ``/etc``
included, and binds nothing of the host's. ``/proc``, ``/dev`` are fresh (``/proc/sys`` and
``/proc/sysrq-trigger`` read-only), and there is no ``/sys``. Each command gets
its own pid, ipc and uts namespaces (it cannot see or signal host processes; when it ends,
everything it started ends) and, unless the phase allows the network, its own network
namespace with only a loopback: the proxy relay listens there, and nothing else is reachable.
All capabilities are dropped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

HOST_RO = ("usr",)
MERGED_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "resolv.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "mime.types",
    "os-release",
    "debian_version",
    "gitconfig",
    "login.defs",
    "environment",
)
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
LINK_MOUNT = "/run/slr"
#: Where an image root without python3 sees the host's ``/usr`` (read-only) for the relay.
HOST_USR_MOUNT = "/.slr-host/usr"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def host_python_argv(python: str) -> list[str] | None:
    """How to run the host's ``python`` (under ``/usr``) inside a root that is not the
    host's, from ``HOST_USR_MOUNT``: through the host's own dynamic loader and libraries,
    isolated from the environment (``-I``). None when it does not live under ``/usr``."""
    real = Path(os.path.realpath(python))
    loader = Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2"))
    usr = Path("/usr")
    if usr not in real.parents or usr not in loader.parents:
        return None

    def inner(path: Path) -> str:
        return f"{HOST_USR_MOUNT}/{path.relative_to(usr).as_posix()}"

    return [inner(loader), "--library-path", inner(loader.parent), inner(real), "-I"]


def make_root(root: Path) -> None:
    """Lay out a fresh sandbox root: mount points, merged-usr links, a private /etc."""
    root.mkdir(parents=True, exist_ok=True)
    for name in HOST_RO:
        (root / name).mkdir(exist_ok=True)
    for name in MERGED_USR_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            if not (root / name).is_symlink():
                (root / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            (root / name).mkdir(exist_ok=True)
    for name in ("root", "home", "run", "logs", "var/tmp", "dev", "proc"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    for name in ETC_FILES:
        src = Path("/etc") / name
        dst = etc / name
        if dst.exists() or dst.is_symlink() or not (src.exists() or src.is_symlink()):
            continue
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True, ignore_dangling_symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=not src.is_symlink())
    (etc / "hostname").write_text("sandbox\n")


def bwrap_argv(
    bwrap: str,
    root: Path,
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    network: bool,
    link_dir: Path | None,
    mounts: Mapping[Path, str] | None = None,
    host_usr: bool = True,
) -> list[str]:
    """bubblewrap's command line for ``argv`` in ``root``. ``host_usr``: bind the host's
    ``/usr`` read-only (a host-userland root); an image root has its own."""
    a = [bwrap, "--bind", str(root), "/"]
    if host_usr:
        for name in HOST_RO:
            a += ["--ro-bind", f"/{name}", f"/{name}"]
        for name in MERGED_USR_LINKS:
            host = Path("/") / name
            if host.is_dir() and not host.is_symlink():
                a += ["--ro-bind", str(host), str(host)]
    a += ["--dev", "/dev", "--proc", "/proc"]
    # bubblewrap run by root leaves the new /proc's sysctls writable, and root needs no
    # capability to write most of them: kernel.core_pattern would run a program of the
    # sandbox's choosing as the host's root. The host's own entries, read-only, cover them.
    a += ["--ro-bind", "/proc/sys", "/proc/sys"]
    a += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    a += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox"]
    if not network:
        a += ["--unshare-net"]
    a += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    if link_dir is not None:
        a += ["--ro-bind", str(link_dir), LINK_MOUNT]
    for host_path, inner in (mounts or {}).items():
        a += ["--ro-bind", str(host_path), inner]
    for k, v in {**BASE_ENV, **env}.items():
        a += ["--setenv", k, v]
    a += ["--chdir", cwd, "--", *argv]
    return a
