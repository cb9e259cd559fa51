"""The run directory: the single source of truth for everything after the fact.

::

    runs/<run-id>/
      config.toml        the resolved config (atomic write)
      metrics.jsonl      one line per optimizer step
      events.jsonl       run-level events (started, resumed, failed, ...)
      trials/<id>.json   one record per trial (atomic write; a trial is never recorded twice)
      checkpoints/       optimizer checkpoints, one folder per step (layout: slr.run.checkpoints)
      run.lock           who holds the run while it is in flight (pid, host, since)

Every whole-file write goes to a temporary file and is renamed into place. Appends are
flushed at once and fsynced when ``sync()`` is called at step boundaries. A process killed
mid-append leaves at most a torn last line, which readers skip and the next writer repairs.

``slr status``, ``slr eval --checkpoint`` and resume read only through ``RunDir`` (and
``slr.run.checkpoints``).

A full disk (or an exhausted quota) does not stop a run: a write that finds no space waits
for space (``wait_for_space``: it retries with back-off, up to ``DISK_FULL_WAIT_S``), then
completes; the log says how long it waited, and a trial record, metrics line or checkpoint
that waited leaves a ``disk_full`` event. Only a disk that stays full that long stops the
run, with ``DiskFull``: what was written stays whole, and ``slr run --resume`` continues
once there is space.

A process that writes a run (``slr run``, ``slr eval``, ``slr infer``, or their
``--resume``) holds an exclusive ``flock`` on ``run.lock`` until it closes the run: a second
writer is refused with one line naming the first, and readers (``slr status``) report the
holder. The kernel drops the lock when its process dies, so a killed run never leaves a
stale one; the pid in the file is only what the holder wrote, read while the lock is held.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import structlog

from slr.contracts import TrialResult
from slr.contracts.serialize import decode, encode
from slr.errors import SlrError, UsageError

log = structlog.get_logger()

T = TypeVar("T")

#: How long a write to a full disk waits for space before the run stops (``DiskFull``).
DISK_FULL_WAIT_S = 900.0
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: Free bytes under which a failed write is taken for a full disk (see ``is_disk_full``).
_NEARLY_FULL = 1 << 20
#: How a write waiting for space waits (a test frees the disk from here).
_pause = time.sleep


class DiskFull(SlrError):
    """The run directory's disk stayed full for ``DISK_FULL_WAIT_S``."""


def is_disk_full(exc: BaseException, where: Path | None = None) -> bool:
    """Whether ``exc`` is a full disk or an exhausted quota: an ``OSError`` saying so,
    here or in an error it came from; or, for a library that loses the reason (torch's
    ``save`` raises a bare ``RuntimeError``), any failed write with next to no space
    left on ``where``'s filesystem."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in _FULL:
            return True
        if "No space left on device" in str(seen) or "Disk quota exceeded" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    if where is None or not isinstance(exc, OSError | RuntimeError):
        return False
    existing = Path(where)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free < _NEARLY_FULL
    except OSError:
        return False


def wait_for_space(
    write: Callable[[], T], where: Path, *, on_waited: Callable[[float], None] | None = None
) -> T:
    """``write()``, run again while it fails for lack of disk space (it must be safe to
    repeat: an atomic write, or one that starts over), waiting with back-off up to
    ``DISK_FULL_WAIT_S``; then ``DiskFull``. ``on_waited(seconds)`` is told how long it
    waited, once it succeeded after a wait."""
    started: float | None = None
    delay = 0.05
    while True:
        try:
            result = write()
        except Exception as exc:
            if not is_disk_full(exc, where):
                raise
            now = time.monotonic()
            if started is None:
                started = now
                log.warning("disk full: waiting for space", path=str(where))
            if now - started >= DISK_FULL_WAIT_S:
                raise DiskFull(
                    f"the disk of {str(where)!r} has been full for {DISK_FULL_WAIT_S:g} s; "
                    f"free space on it (or move the run), then `slr run --resume RUN_DIR` "
                    f"(docs/troubleshooting/training.md#the-run-directorys-disk-is-full)"
                ) from exc
            _pause(delay)  # waiting on the disk, not on another part of the run
            delay = min(delay * 2, 2.0)
            continue
        if started is not None:
            waited = time.monotonic() - started
            log.warning("disk has space again", path=str(where), waited_s=round(waited, 2))
            if on_waited is not None:
                on_waited(waited)
        return result


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``path`` so a reader sees the old content or the new, never a torn file; on a
    full disk, wait for space (``wait_for_space``)."""
    wait_for_space(lambda: _atomic_write(path, data), path)


def _atomic_write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunInUse(UsageError):
    """Another live process already writes this run directory."""


def _repair_torn_tail(path: Path) -> None:
    """Cut a partial last line left by a killed writer, so appends start on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        data = path.read_bytes()
        fh.truncate(data.rfind(b"\n") + 1)


def read_jsonl_from(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of ``path`` after byte ``offset``, and the offset after the last.

    A torn last line (a writer mid-append) is left for the next call, so a follower that
    keeps the returned offset reads each record exactly once, and never the whole file again.
    """
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            record = None  # not written by RunDir (a hand edit): a live view goes on past it
            log.warning(
                "run.unreadable_line", path=str(path), line=line[:200].decode(errors="replace")
            )
        if isinstance(record, dict):
            records.append(record)
    return records, offset + end


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return  # torn tail from a killed writer
            line = raw.strip()
            if line:
                yield json.loads(line)


class RunDir:
    """One run's folder. ``create`` for a new run, ``open`` for an existing one."""

    CONFIG = "config.toml"
    METRICS = "metrics.jsonl"
    EVENTS = "events.jsonl"
    LOCK = "run.lock"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.id = self.path.name
        self._handles: dict[str, Any] = {}
        # trial records are written from threads, and one that waited for space appends
        # an event: appends are serialised (re-entrant: that event is an append too)
        self._lock = threading.RLock()
        self._hold_fd: int | None = None  # the run.lock descriptor while this process holds the run

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def create(cls, runs_dir: Path, name: str, config_toml: str) -> RunDir:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = Path(runs_dir) / f"{name}-{stamp}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        (path / "trials").mkdir(parents=True)
        (path / "checkpoints").mkdir()
        run = cls(path)
        atomic_write(path / cls.CONFIG, config_toml)
        return run

    @staticmethod
    def check_new(path: Path, *, resume: str = "slr run --resume") -> None:
        """``UsageError`` unless ``path`` is free for a new run (absent, or an empty folder);
        ``resume`` is the command that would continue what is there."""
        path = Path(path)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UsageError(
                f"--output {str(path)!r} exists and is not empty; pick a new folder, or "
                f"continue the run there with `{resume} {path}`"
            )

    @classmethod
    def create_at(cls, path: Path, config_toml: str, *, resume: str = "slr run --resume") -> RunDir:
        """A new run in exactly ``path`` (``--output``), which must not hold anything."""
        path = Path(path)
        cls.check_new(path, resume=resume)
        (path / "trials").mkdir(parents=True, exist_ok=True)
        (path / "checkpoints").mkdir(exist_ok=True)
        atomic_write(path / cls.CONFIG, config_toml)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        path = Path(path)
        cls._check(path)
        run = cls(path)
        if run.holder() is None:  # a live writer's last line may be half-written: leave it
            for name in (cls.METRICS, cls.EVENTS):
                _repair_torn_tail(path / name)
        (path / "trials").mkdir(exist_ok=True)
        (path / "checkpoints").mkdir(exist_ok=True)
        return run

    # -- who writes it ------------------------------------------------------------------

    def hold(self) -> None:
        """Take the run for this process until ``close()``; ``RunInUse`` (one line, naming
        the holder) when another live process has it."""
        if self._hold_fd is not None:
            return
        fd = os.open(self.path / self.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        held: dict[str, Any] | None = None
        for _ in range(3):  # a reader's probe holds a shared lock for an instant: try again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = None
                break
            except BlockingIOError:
                held = self.holder()
        else:
            held = held or {}
        if held is not None:
            os.close(fd)
            raise RunInUse(
                f"run {str(self.path)!r} is in flight in another process (pid "
                f"{held.get('pid', '?')} on {held.get('host', '?')} since "
                f"{held.get('since', '?')}); watch it with `slr status {self.path}`, or stop "
                f"that process before resuming"
            ) from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record, sort_keys=True) + "\n").encode(), 0)
        self._hold_fd = fd

    def holder(self) -> dict[str, Any] | None:
        """The live process that holds the run (pid, host, since, command), else None.

        It probes with a shared lock, taken and dropped at once: a holder's exclusive lock
        refuses it; with no holder the file's content is left from a finished run."""
        path = self.path / self.LOCK
        if self._hold_fd is not None:
            return json.loads(os.pread(self._hold_fd, 4096, 0) or b"{}")
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raw = os.pread(fd, 4096, 0)
                try:
                    return json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError:
                    return {}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    @classmethod
    def watch(cls, path: Path) -> RunDir:
        """An existing run, for reading only while its writer may still be going: unlike
        ``open`` it repairs and creates nothing (a torn last line may be a live append)."""
        path = Path(path)
        cls._check(path)
        return cls(path)

    @classmethod
    def _check(cls, path: Path) -> None:
        if not (path / cls.CONFIG).is_file():
            raise UsageError(
                f"{str(path)!r} is not a run directory (no {cls.CONFIG}); "
                f"runs live under the config's run.runs_dir, e.g. runs/<run-id>"
            )

    # -- writing -------------------------------------------------------------------------

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._append_locked(name, record)

    def _append_locked(self, name: str, record: dict[str, Any]) -> None:
        fh = self._handles.get(name)
        if fh is None:
            # unbuffered: each write says how much reached the file, so a line cut short by
            # a full disk is finished, not written twice, once there is space again
            fh = self._handles[name] = (self.path / name).open("ab", buffering=0)
        line = memoryview((json.dumps(record, sort_keys=True, default=str) + "\n").encode())
        waited = 0.0

        def note(seconds: float) -> None:
            nonlocal waited
            waited += seconds

        while line:
            written = wait_for_space(
                lambda view=line: fh.write(view), self.path / name, on_waited=note
            )
            line = line[written or 0 :]
        if waited and name == self.EVENTS and record.get("event") == "disk_full":
            return
        if waited:
            self.append_event("disk_full", waited_s=round(waited, 2), file=name)

    def append_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self._append(self.METRICS, {"step": step, **metrics})

    def append_event(self, event: str, **fields: Any) -> None:
        now = dt.datetime.now(dt.UTC).isoformat()
        self._append(self.EVENTS, {"event": event, "time": now, **fields})

    def write_trial(self, trial: TrialResult) -> Path:
        """Record a trial. Recording the same trial id twice is a bug and raises.

        It blocks (encode, write, fsync): code on an event loop calls it in a thread, as
        ``TrialRecorder.record`` does.
        """
        path = self.path / "trials" / f"{trial.trial_id}.json"
        if path.exists():
            raise FileExistsError(f"trial {trial.trial_id} is already recorded at {path}")
        data = encode(trial)
        waited = 0.0

        def note(seconds: float) -> None:
            nonlocal waited
            waited = seconds

        wait_for_space(lambda: _atomic_write(path, data), path, on_waited=note)
        if waited:
            self.append_event("disk_full", waited_s=round(waited, 2), file=f"trials/{path.name}")
        return path

    def sync(self) -> None:
        """Make every append so far durable (called at step boundaries)."""
        with self._lock:
            for fh in self._handles.values():
                os.fsync(fh.fileno())

    def close(self) -> None:
        self.sync()
        with self._lock:
            for fh in self._handles.values():
                fh.close()
            self._handles.clear()
        if self._hold_fd is not None:
            os.close(self._hold_fd)  # closing the descriptor drops the flock
            self._hold_fd = None

    # -- reading -------------------------------------------------------------------------

    def config_text(self) -> str:
        return (self.path / self.CONFIG).read_text()

    def metrics(self) -> list[dict[str, Any]]:
        return list(_read_jsonl(self.path / self.METRICS))

    def events(self) -> list[dict[str, Any]]:
        return list(_read_jsonl(self.path / self.EVENTS))

    def follow(self, name: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Records appended to ``name`` (``METRICS`` or ``EVENTS``) since byte ``offset``,
        and the offset to pass next time (``read_jsonl_from``): how a live reader tails."""
        if name not in (self.METRICS, self.EVENTS):
            raise ValueError(
                f"{name!r} is not one of the run's logs ({self.METRICS}, {self.EVENTS})"
            )
        return read_jsonl_from(self.path / name, offset)

    def trial_ids(self) -> set[str]:
        return {p.stem for p in (self.path / "trials").glob("*.json")}

    def has_trial(self, trial_id: str) -> bool:
        return (self.path / "trials" / f"{trial_id}.json").is_file()

    def trial(self, trial_id: str) -> TrialResult:
        """The record of one trial (``FileNotFoundError`` if it has none)."""
        path = self.path / "trials" / f"{trial_id}.json"
        return decode(path.read_bytes(), TrialResult)

    def trials(self) -> Iterator[TrialResult]:
        for p in sorted((self.path / "trials").glob("*.json")):
            yield decode(p.read_bytes(), TrialResult)
