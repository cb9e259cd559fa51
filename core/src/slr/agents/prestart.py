"""Prestarted interpreters: a Python scaffold's start-up paid while its sandbox waits in the pool.

OpenHands and Terminus-2 import litellm (thousands of modules, seconds of CPU) from their
own modules, and no setting of theirs avoids it. What can move is *when* it is paid: while a
sandbox waits in the warm pool (``slr.sandboxing.pool``) for its trial, the adapter starts
the scaffold's interpreter in it with the heavy modules imported (``start_interpreter``),
waiting on a socket; the trial's command is then a small launcher that hands that
interpreter the driver's argv, the environment (with the session's key), the working folder
and its own stdio, and exits with the driver's status (``prestart_main``, which runs in the
sandbox). From the trial's side it is ``python driver.py settings.json``, already imported.

What it keeps:

- isolation: the interpreter is started in the trial's own fresh sandbox, after the sandbox
  is made and before its trial is known; it serves one launch and nothing else;
- honest cost: it runs in the sandbox, so its CPU is the sandbox's and is charged to the
  trial it serves (``costs.cpu_s.sandbox_start``, as all pool CPU is); only the wall time
  to the first model call shrinks, and the agent start-up phase's own CPU;
- the trial's timeout: the launcher's connection is the interpreter's lifeline, so killing
  the launcher (timeout, cancel) kills the interpreter's process group;
- a fallback: an interpreter that failed to start or died is not used; the trial starts its
  scaffold afresh, as without a pool.

A pooled sandbox carries its interpreter as ``prestarted`` (set by the pool from what the
agent's ``prestart(sandbox)`` returned); ``take`` hands it to the adapter's ``run`` once.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import structlog

from slr.contracts import ExecResult, PoolStarted, Sandbox

log = structlog.get_logger()

#: The interpreter's folder in the sandbox (its program, socket and ready fifo); outside
#: the agent folder, which each run replaces.
PRESTART_DIR = "/tmp/slr-prestart"
#: How long an interpreter may take to import its modules before the pool gives up on it.
READY_TIMEOUT_S = 600.0
#: How long after its launch ended the interpreter's own exec may take to end.
EXIT_GRACE_S = 15.0

_PROGRAM = "prestart_main.py"


class Prestarted:
    """An interpreter waiting in a sandbox for its trial's launch.

    ``python`` is the interpreter it runs on, ``wrap`` what its command line was wrapped in
    (the launcher gets the same), ``server`` the exec it runs in (it ends when the
    interpreter exits).
    """

    def __init__(
        self, *, python: str, wrap: Callable[[str], str], server: asyncio.Future[ExecResult]
    ) -> None:
        self.python = python
        self.wrap = wrap
        self.server = server

    @property
    def alive(self) -> bool:
        return not self.server.done()

    def command(self, argv: Sequence[str]) -> str:
        """The trial's command: the launcher handing ``argv`` (what would follow ``python``)
        to the waiting interpreter; stdin closed, as ``driver_command``'s."""
        program = f"{PRESTART_DIR}/{_PROGRAM}"
        launcher = [self.python, "-I", "-S", program, "run", PRESTART_DIR, "--", *argv]
        return self.wrap(shlex.join(launcher) + " </dev/null")

    async def finished(self) -> ExecResult | None:
        """The interpreter's own exec once it ended (None when it did not end in time, was
        cancelled, or its sandbox failed under it)."""
        if self.server.cancelled():
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(self.server), EXIT_GRACE_S)
        except Exception:  # not in time, or the sandbox died: only its logs are missing
            return None

    async def close(self) -> None:
        """End the interpreter's exec (a sandbox stop ends it too)."""
        if not self.server.done():
            self.server.cancel()
        with contextlib.suppress(BaseException):
            await self.server


def take(sandbox: Sandbox) -> Prestarted | None:
    """The sandbox's prestarted interpreter, once (None without one, or once taken)."""
    if not isinstance(sandbox, PoolStarted):
        return None
    prestarted = sandbox.prestarted
    if not isinstance(prestarted, Prestarted):
        return None
    sandbox.prestarted = None
    return prestarted if prestarted.alive else None


def _retrieved(fut: asyncio.Future[Any]) -> None:
    # The exec ends when the interpreter or the sandbox does; nobody may be left waiting.
    if not fut.cancelled():
        fut.exception()


async def start_interpreter(
    sandbox: Sandbox,
    *,
    python: str,
    modules: Sequence[str],
    env: Mapping[str, str],
    wrap: Callable[[str], str] = lambda line: line,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> Prestarted | None:
    """Start ``python`` in ``sandbox`` with ``modules`` imported, waiting for one launch.

    ``env`` is the scaffold's environment without anything trial-specific (the launch brings
    the trial's whole environment); ``wrap`` turns the command line into the shell line the
    scaffold needs around it (e.g. ``slr.agents.tmux.with_tmux``). Returns once the modules
    are imported, or None (logged) when the interpreter could not start: the trial then
    starts its scaffold afresh.
    """
    setup = await sandbox.exec(
        f"rm -rf {PRESTART_DIR} && mkdir -p {PRESTART_DIR} && mkfifo {PRESTART_DIR}/ready",
        timeout_s=30,
    )
    if not setup.ok:
        log.warning("no prestarted interpreter: setting up failed", stderr=setup.stderr[-500:])
        return None
    with tempfile.TemporaryDirectory(prefix="slr-prestart-") as tmp:
        program = Path(tmp) / _PROGRAM
        program.write_text(files("slr.agents").joinpath(_PROGRAM).read_text())
        await sandbox.upload(program, f"{PRESTART_DIR}/{_PROGRAM}")
    argv = [python, f"{PRESTART_DIR}/{_PROGRAM}", "serve", PRESTART_DIR, *modules]
    line = wrap(shlex.join(argv) + " </dev/null")
    server = asyncio.ensure_future(sandbox.exec(line, env=dict(env)))
    server.add_done_callback(_retrieved)
    probe = asyncio.ensure_future(
        sandbox.exec(f"cat {PRESTART_DIR}/ready", timeout_s=ready_timeout_s)
    )
    probe.add_done_callback(_retrieved)
    try:
        await asyncio.wait({server, probe}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        for fut in (probe, server):
            fut.cancel()
        await asyncio.gather(probe, server, return_exceptions=True)
        raise
    ready = probe.done() and not probe.cancelled() and probe.exception() is None
    if ready and probe.result().stdout.strip() == "ready" and not server.done():
        return Prestarted(python=python, wrap=wrap, server=server)
    probe.cancel()
    server.cancel()
    results = await asyncio.gather(server, probe, return_exceptions=True)
    why = next((r.stderr[-1500:] for r in results if isinstance(r, ExecResult) and r.stderr), "")
    log.warning("no prestarted interpreter: it did not start", stderr=why or repr(results[0]))
    return None
