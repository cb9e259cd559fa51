"""CPU meters for sandboxes: cumulative CPU seconds of everything that ran in one, read
from its control group (``slr.contracts.MeteredSandbox``).

A cgroup counts every process in it, however it forked or re-parented, so it is the one
reading that a scaffold's helper processes cannot escape. Docker puts each container in its
own group (``container_cgroup``); the local backend makes one per sandbox under
``slr`` in a writable ``cpuacct`` (v1) or unified (v2) hierarchy (``SandboxCgroup``) and
each command joins it before it starts. Where no hierarchy is writable (an unprivileged
container, a remote daemon) the meter is absent and the trial record says CPU was not
measured.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The folder, inside a hierarchy, holding the local backend's per-sandbox groups.
SLR_GROUP = "slr"


def read_cpu_s(group: Path) -> float | None:
    """Cumulative CPU seconds of a cgroup folder (v1 cpuacct or v2); None if unreadable."""
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        pass
    try:
        for line in (group / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def container_cgroup(container_id: str, root: Path = CGROUP_ROOT) -> Path | None:
    """A docker container's cgroup folder on this machine (cgroupfs or systemd driver, v1 or
    v2), or None when none is found (a remote daemon, another layout)."""
    for group in (
        root / "cpuacct" / "docker" / container_id,
        root / "cpu,cpuacct" / "docker" / container_id,
        root / "cpuacct" / "system.slice" / f"docker-{container_id}.scope",
        root / "docker" / container_id,
        root / "system.slice" / f"docker-{container_id}.scope",
    ):
        if read_cpu_s(group) is not None:
            return group
    return None


def _writable_hierarchy(root: Path) -> Path | None:
    for base in (root / "cpuacct", root / "cpu,cpuacct", root / "unified", root):
        if (base / "cgroup.procs").is_file() and os.access(base, os.W_OK):
            if (base / "cpuacct.usage").is_file() or (base / "cgroup.controllers").is_file():
                return base
    return None


class SandboxCgroup:
    """One sandbox's own cgroup; commands join it through ``wrap`` before they start."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, root: Path = CGROUP_ROOT) -> SandboxCgroup | None:
        """A new group ``slr/<name>``, or None when no hierarchy is writable here."""
        base = _writable_hierarchy(root)
        if base is None:
            return None
        path = base / SLR_GROUP / name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        group = cls(path)
        if group.cpu_s() is None:
            group.remove()
            return None
        return group

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into this group, so the command
        and everything it starts are counted. A failed move costs the metering, not the
        command."""
        return [
            "/bin/sh",
            "-c",
            '{ echo $$ > "$0"; } 2>/dev/null; exec "$@"',
            str(self.path / "cgroup.procs"),
            *argv,
        ]

    def cpu_s(self) -> float | None:
        return read_cpu_s(self.path)

    def remove(self) -> None:
        """Remove the group (it must hold no process: kill them first)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def remove_stale_cgroups(in_use: Callable[[str], bool], root: Path = CGROUP_ROOT) -> int:
    """Remove the empty ``slr/<name>`` groups whose ``name`` is not ``in_use``."""
    base = _writable_hierarchy(root)
    if base is None or not (base / SLR_GROUP).is_dir():
        return 0
    removed = 0
    for group in (base / SLR_GROUP).iterdir():
        if group.is_dir() and not in_use(group.name):
            with contextlib.suppress(OSError):
                group.rmdir()
                removed += 1
    return removed


__all__ = [
    "SandboxCgroup",
    "container_cgroup",
    "read_cpu_s",
    "remove_stale_cgroups",
]
