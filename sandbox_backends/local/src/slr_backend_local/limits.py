"""Resource limits of one local sandbox: processes, memory, file size, open files.

A local sandbox shares the machine with the run itself and with every other trial, so an
agent's fork bomb, memory hog or runaway log must hit a wall of its own before it hits the
machine's. Two mechanisms, each used where it works:

- **control groups**, for what rlimits cannot bound: the number of processes (an rlimit on
  processes counts every process of the user and does not apply to root at all) and the
  memory actually used. One group per sandbox in each of the ``pids`` and ``memory``
  controllers, made *inside* the group this process already runs in (so the limits of a
  container or a systemd slice around ``slr`` still apply on top), on cgroup v2 where that
  group delegates both controllers and on v1 where their hierarchies are writable. Every
  command joins them before it starts; a process cannot leave them.
- **rlimits**, on every command (inherited by everything it starts): open files, the size
  of one file, processes (for a non-root user: bubblewrap's user namespace makes the count
  the sandbox's own), and, only where no memory group could be made, the address space.

``SandboxLimits.wrap`` puts both in front of bubblewrap's command line.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from attrs import frozen

from slr.contracts import SandboxError

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The folder, inside this process's own group, that holds the per-sandbox groups.
LIMITS_GROUP = "slr-limits"
_MB = 1024 * 1024
# Where only an address-space rlimit bounds memory: JIT runtimes (node, the JVM) reserve far
# more virtual memory than they use, so the bound is this many times the task's memory.
ADDRESS_SPACE_FACTOR = 4


@frozen(kw_only=True)
class Limits:
    """What one sandbox may use. ``memory_mb`` and ``file_size_mb`` come from the task
    (``[environment] memory_mb`` / ``storage_mb``); the others from the backend's config."""

    pids: int
    memory_mb: int
    file_size_mb: int
    open_files: int


def _own_group(controller: str, proc_cgroup: str) -> str | None:
    """This process's group path in ``controller``'s hierarchy (``""`` for v2's)."""
    for line in proc_cgroup.splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return None


class LimitGroups:
    """One sandbox's groups (zero, one or two folders) and what each enforces."""

    def __init__(self, folders: list[Path], *, pids: bool, memory: bool) -> None:
        self.folders = folders
        self.pids = pids
        self.memory = memory

    @classmethod
    def create(cls, name: str, limits: Limits, root: Path = CGROUP_ROOT) -> LimitGroups:
        """Make the groups for ``name`` where this machine lets us; see the module doc."""
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return cls([], pids=False, memory=False)
        values = {"pids": str(limits.pids), "memory": str(limits.memory_mb * _MB)}
        v2 = _v2_group(root, proc_cgroup, name, values)
        if v2 is not None:
            return cls([v2], pids=True, memory=True)
        folders: list[Path] = []
        enforced = {"pids": False, "memory": False}
        v1_files = {
            "pids": {"pids.max": values["pids"]},
            "memory": {
                "memory.limit_in_bytes": values["memory"],
                # no swap beyond the memory limit, where swap accounting exists
                "memory.memsw.limit_in_bytes": values["memory"],
            },
        }
        for controller, files in v1_files.items():
            own = _own_group(controller, proc_cgroup)
            hierarchy = root / controller
            base = hierarchy / (own or "").lstrip("/")
            # our own group must be visible here: never make groups beside it (outside the
            # limits of whatever contains slr)
            if own is None or not (base / "cgroup.procs").is_file():
                continue
            folder = base / LIMITS_GROUP / name
            if _make(folder, files, required=next(iter(files))):
                folders.append(folder)
                enforced[controller] = True
        return cls(folders, pids=enforced["pids"], memory=enforced["memory"])

    def join_argv(self) -> list[str]:
        """A shell prefix that moves itself into every group, then runs the command."""
        if not self.folders:
            return []
        joins = "".join(f'echo $$ > "${i + 1}" && ' for i in range(len(self.folders)))
        n = len(self.folders)
        # A command that cannot join its groups does not run unbounded.
        script = (
            f'{joins}shift {n} && exec "$@" || '
            '{ echo "slr: cannot join the sandbox control groups" >&2; exit 125; }'
        )
        return ["/bin/sh", "-c", script, "sh", *(str(f / "cgroup.procs") for f in self.folders)]

    def oom_kills(self) -> int:
        """How many processes the kernel has killed for this sandbox's memory limit so far
        (``oom_kill`` in v2's ``memory.events``, v1's ``memory.oom_control``); 0 without a
        memory group or where the kernel does not count them."""
        if not self.memory:
            return 0
        total = 0
        for folder in self.folders:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (folder / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            total += int(value)
        return total

    def remove(self) -> None:
        """Remove the groups (their processes must be gone; a miss goes at the next start)."""
        for folder in self.folders:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _v2_group(root: Path, proc_cgroup: str, name: str, values: dict[str, str]) -> Path | None:
    """A v2 group with pids and memory limits, or None where v2 does not delegate them."""
    for mount in (root, root / "unified"):
        if not (mount / "cgroup.controllers").is_file():
            continue
        own = _own_group("", proc_cgroup)
        if own is None:
            continue
        parent = mount / own.lstrip("/") / LIMITS_GROUP
        try:
            if not {"pids", "memory"} <= set(
                (parent.parent / "cgroup.controllers").read_text().split()
            ):
                continue  # not delegated to us
            parent.mkdir(exist_ok=True)
            # Fails (EBUSY) where our own group holds processes and is not the root: v2
            # lets only leaves hold them. Then the v1 controllers, or rlimits, apply.
            (parent.parent / "cgroup.subtree_control").write_text("+pids +memory")
            (parent / "cgroup.subtree_control").write_text("+pids +memory")
        except OSError:
            continue
        folder = parent / name
        files = {"pids.max": values["pids"], "memory.max": values["memory"], "memory.swap.max": "0"}
        if _make(folder, files, required="memory.max"):
            return folder
    return None


def _make(folder: Path, files: dict[str, str], *, required: str) -> bool:
    """Make ``folder`` and write its limit files; False (and nothing left) if the required
    one cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    for file, value in files.items():
        try:
            (folder / file).write_text(value)
        except OSError:
            if file == required:
                with contextlib.suppress(OSError):
                    folder.rmdir()
                return False
    return True


def rlimit_argv(limits: Limits, *, address_space: bool) -> list[str]:
    """A prefix that sets the rlimits, then runs the command: ``prlimit`` (util-linux)."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxError(
            "the local backend's resource limits need prlimit (util-linux), which is not "
            "installed; install util-linux, or set [backend] limits = 'off'"
        )
    argv = [
        prlimit,
        f"--nofile={limits.open_files}",
        f"--fsize={limits.file_size_mb * _MB}",
        f"--nproc={limits.pids}",
    ]
    if address_space:
        argv.append(f"--as={limits.memory_mb * _MB * ADDRESS_SPACE_FACTOR}")
    return [*argv, "--"]


class SandboxLimits:
    """The limits of one sandbox, as a command-line prefix (``wrap``) and a cleanup."""

    def __init__(self, limits: Limits, groups: LimitGroups, *, rlimits: bool = True) -> None:
        self.limits = limits
        self.groups = groups
        self._rlimits = rlimit_argv(limits, address_space=not groups.memory) if rlimits else []

    @classmethod
    def create(cls, name: str, limits: Limits, *, cgroups: bool = True) -> SandboxLimits:
        if cgroups:
            groups = LimitGroups.create(name, limits)
        else:
            groups = LimitGroups([], pids=False, memory=False)
        return cls(limits, groups)

    def describe(self) -> dict[str, str]:
        """How each limit is enforced here, for logs and tests."""
        cg = "cgroup"
        return {
            "pids": cg if self.groups.pids else "rlimit (not for root)",
            "memory": cg if self.groups.memory else "rlimit (address space)",
            "file_size": "rlimit",
            "open_files": "rlimit",
        }

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return [*self.groups.join_argv(), *self._rlimits, *argv]

    def oom_kills(self) -> int:
        return self.groups.oom_kills()

    def oom_message(self, before: int) -> str:
        """A line for a command's stderr when the memory limit killed something since
        ``before`` (an earlier ``oom_kills()``); ``""`` otherwise. Without it a command
        killed this way shows only exit status 137, which reads like any other kill."""
        killed = self.oom_kills() - before
        if killed <= 0:
            return ""
        return (
            f"slr: the sandbox reached its memory limit ({self.limits.memory_mb} MB, the "
            f"task's [environment] memory_mb) and the kernel killed {killed} process(es); "
            "raise memory_mb in the task's task.toml if the agent or its tests need more\n"
        )

    def remove(self) -> None:
        self.groups.remove()


def remove_stale_groups(in_use: Callable[[str], bool], root: Path = CGROUP_ROOT) -> int:
    """Remove the empty per-sandbox groups whose name is not ``in_use``."""
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        return 0
    parents = []
    for controller in ("pids", "memory", ""):
        own = _own_group(controller, proc_cgroup)
        if own is None:
            continue
        mounts = [root, root / "unified"] if controller == "" else [root / controller]
        parents += [m / own.lstrip("/") / LIMITS_GROUP for m in mounts]
    removed = 0
    for parent in parents:
        if not parent.is_dir():
            continue
        for group in parent.iterdir():
            if group.is_dir() and not in_use(group.name):
                with contextlib.suppress(OSError):
                    group.rmdir()
                    removed += 1
    return removed


__all__ = ["LimitGroups", "Limits", "SandboxLimits", "remove_stale_groups", "rlimit_argv"]
