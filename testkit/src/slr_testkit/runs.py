"""A run directory held by another live process, as a running ``slr run`` holds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Takes the run, says so, then waits to be killed.
_HOLDER = textwrap.dedent(
    """
    import sys
    from slr.run.directory import RunDir
    run = RunDir.open(sys.argv[1])
    run.hold()
    print("held", flush=True)
    sys.stdin.read()
    """
)


@contextmanager
def held_by_another_process(path: Path) -> Iterator[subprocess.Popen]:
    """Yield a process that holds the run at ``path`` (``RunDir.hold``); SIGKILL it after,
    as a crashed run dies."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "held\n", f"the holder did not take {path}: {line!r}"
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
