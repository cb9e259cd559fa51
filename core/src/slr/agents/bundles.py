"""Agent runtime bundles: built once on the host, mounted read-only into every sandbox.

A bundle is one folder, ``<cache>/bundles/<name>-<version>/``, holding everything a scaffold
needs to run inside a sandbox whose image knows nothing about it: an npm package (with the
``node`` it runs on, when it needs one), or a Python interpreter with the scaffold's
packages installed into it. Bundles are relocatable (no venv, no absolute paths), so the
trial runner may mount them read-only at any path; an adapter asks ``bundle_root`` where.
Nothing is installed per trial.

Builds are serialised across processes with a file lock, happen in a temporary folder
beside the final one and are renamed into place when complete, with a ``.slr-bundle.json``
marker (``Marker``, the one reader and writer of that file): a build killed half-way, or a
folder whose marker is missing, unreadable or for another bundle, is rebuilt, never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import structlog
from attrs import frozen

from slr.contracts.agent import Bundle
from slr.errors import SlrError

log = structlog.get_logger()

#: The file whose presence (with a matching name and version) makes a bundle folder complete.
MARKER = ".slr-bundle.json"


class BundleError(SlrError):
    """A bundle could not be built; the message names the step, the command and its output."""


def cache_dir() -> Path:
    """``$SLR_CACHE_DIR``, else ``~/.cache/slr``."""
    raw = os.environ.get("SLR_CACHE_DIR")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "slr"


def bundles_dir() -> Path:
    return cache_dir() / "bundles"


@frozen(kw_only=True)
class BuildStep:
    """What a bundle recipe gets to work with: the target folder and a progress reporter."""

    path: Path
    report: Callable[[str], None]
    #: The bundle's ``name-version`` (for errors); the path is a temporary folder.
    bundle: str = ""

    def run(self, argv: Sequence[str | Path], *, env: dict[str, str] | None = None) -> None:
        """Run one build command, its output shown as progress; fail with its tail."""
        argv = [str(a) for a in argv]
        self.report("$ " + " ".join(argv))
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                tail = [*tail[-40:], line]
                self.report(line)
        if proc.wait() != 0:
            raise BundleError(
                f"building bundle {self.bundle or self.path.name}: `{' '.join(argv)}` exited "
                f"with {proc.returncode}:\n" + "\n".join(tail) + "\nFix the cause shown above "
                "and run again: the half-built folder was removed, the build starts afresh."
            )


Recipe = Callable[[BuildStep], None]


def _progress() -> tuple[Callable[[str], None], Callable[[], None]]:
    """A one-line live display on a terminal, plain log lines otherwise."""
    if sys.stderr.isatty():
        from rich.console import Console

        status = Console(stderr=True).status("")
        status.start()
        return (lambda line: status.update(line[:150])), status.stop
    return (lambda line: print(f"  {line}", file=sys.stderr, flush=True)), (lambda: None)


@contextlib.contextmanager
def _locked(lock_path: Path, name: str) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process building bundle {name} ...", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@frozen(kw_only=True)
class Marker:
    """What ``MARKER`` in a bundle folder records: which bundle it is and how long it took."""

    name: str
    version: str
    build_seconds: float = 0.0

    def write(self, folder: Path) -> None:
        # json.dumps' default separators: ``shell_test`` greps for exactly this spelling.
        (folder / MARKER).write_text(
            json.dumps(
                {"name": self.name, "version": self.version, "build_seconds": self.build_seconds}
            )
        )

    @classmethod
    def read(cls, folder: Path) -> Marker | None:
        """The marker in ``folder``, or None when it is missing or not a marker (cut short)."""
        try:
            raw = json.loads((folder / MARKER).read_text())
            return cls(
                name=str(raw["name"]),
                version=str(raw["version"]),
                build_seconds=float(raw.get("build_seconds", 0.0)),
            )
        except (OSError, ValueError, TypeError, KeyError):
            return None

    @staticmethod
    def shell_test(folder: str, version: str) -> str:
        """A shell condition, true when ``folder`` (as a sandbox sees it) holds a complete
        bundle of ``version``: for finding a bundle where no Python runs."""
        needle = shlex.quote(f'"version": {json.dumps(version)}')
        return f"grep -qF {needle} {folder}/{MARKER} 2>/dev/null"


def existing(name: str, version: str) -> Bundle | None:
    """The finished bundle, or None when it has not been built (yet), or its folder holds
    no valid marker for ``name-version`` (a partial or foreign folder: ``ensure`` rebuilds it)."""
    path = bundles_dir() / f"{name}-{version}"
    marker = Marker.read(path)
    if marker is not None and (marker.name, marker.version) == (name, version):
        return Bundle(path=path, version=version)
    return None


def ensure(name: str, version: str, recipe: Recipe) -> Bundle:
    """Return the bundle ``name-version``, building it with ``recipe`` first if needed.

    ``recipe`` fills ``step.path`` (a temporary folder, renamed when the recipe is done).
    Another process building the same bundle is waited for, not raced.
    """
    found = existing(name, version)
    if found is not None:
        return found
    folder = f"{name}-{version}"
    path = bundles_dir() / folder
    with _locked(bundles_dir() / f".{folder}.lock", folder):
        found = existing(name, version)
        if found is not None:
            return found
        building = path.with_name(f".{folder}.building")
        for stale in (path, building):  # a build that was killed half-way
            if stale.exists():
                shutil.rmtree(stale)
        building.mkdir(parents=True)
        report, stop = _progress()
        started = time.monotonic()
        print(f"building bundle {folder} in {path} (once; later runs reuse it)", file=sys.stderr)
        try:
            recipe(BuildStep(path=building, report=report, bundle=folder))
        except BaseException:
            stop()
            shutil.rmtree(building, ignore_errors=True)
            raise
        stop()
        took = time.monotonic() - started
        Marker(name=name, version=version, build_seconds=round(took, 1)).write(building)
        building.rename(path)
        print(f"built bundle {folder} in {took:.0f}s ({_size_mb(path)} MB)", file=sys.stderr)
        log.info("bundle built", bundle=folder, seconds=round(took, 1))
        return Bundle(path=path, version=version)


def _size_mb(path: Path) -> int:
    total, seen = 0, set()
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                if (st.st_dev, st.st_ino) not in seen:  # npm hard-links native binaries
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total // 2**20
