"""Running a scaffold headless in a sandbox: its files in, one command, its own logs out.

The agent adapters share this; each supplies only what is its scaffold's own (command line,
environment, config files, where its logs are, what to end after it): this module knows no
particular scaffold, library or tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from slr.agents.bundles import Marker
from slr.agents.prestart import Prestarted
from slr.agents.prestart_main import UNAVAILABLE, UNAVAILABLE_EXIT
from slr.contracts import BUNDLE_MOUNT, AgentOutcome, Bundle, Endpoint, Sandbox, SandboxError
from slr.errors import SlrError

log = structlog.get_logger()


class ScaffoldCrashed(SlrError):
    """The scaffold could not run or died abnormally (not found, killed by a signal, an
    uncaught exception). The trial runner records ``agent_error``; logs are attached."""

    def __init__(self, message: str, *, outcome: AgentOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


#: Where adapters put a trial's scaffold files (config, instruction, logs) in the sandbox.
AGENT_DIR = "/tmp/slr-agent"
#: The most of one log file kept in the trial record; the rest is cut (the head is kept).
MAX_LOG_CHARS = 2_000_000
#: How long past ``timeout_s`` the adapter waits for the sandbox to report the kill.
KILL_GRACE_S = 30.0


async def run_headless(
    sandbox: Sandbox,
    *,
    command: str,
    env: Mapping[str, str],
    timeout_s: float,
    files: Mapping[str, str] | None = None,
    logs_from: Sequence[str] = (),
    cleanup: str | None = None,
    bundle: Bundle | None = None,
    crash_markers: Sequence[str] = (),
) -> AgentOutcome:
    """Upload ``files`` (relative to ``AGENT_DIR``), run ``command`` under ``timeout_s``,
    then run ``cleanup`` and gather ``logs_from`` (sandbox files or folders) into the logs.

    How the scaffold ended is reported: a hang is ``timed_out``; a non-zero exit after it
    ended its conversation (turn limit, a model error it gave up on) is an ordinary outcome
    with its exit code. A crash raises ``ScaffoldCrashed``: exit 126/127 (cannot run), 128+N
    (killed by signal N), or any of ``crash_markers`` (e.g. a Python traceback) in its
    stderr together with a non-zero exit. A dead sandbox raises ``SandboxError``.
    """
    await _upload_files(sandbox, files or {})
    try:
        result = await asyncio.wait_for(
            sandbox.exec(command, timeout_s=timeout_s, env=dict(env)),
            timeout=timeout_s + KILL_GRACE_S,
        )
        exit_code, timed_out = result.exit_code, result.timed_out
        logs = {"stdout": _cut(result.stdout), "stderr": _cut(result.stderr)}
    except TimeoutError:
        # The backend did not come back from killing it; the agent still ran out of time.
        exit_code, timed_out, logs = None, True, {}
    if cleanup:
        with contextlib.suppress(SandboxError, TimeoutError):
            await sandbox.exec(cleanup, timeout_s=30)
    logs.update(await collect_logs(sandbox, logs_from))
    if bundle is not None:
        # The exact runtime of this trial, in its record.
        logs["bundle"] = json.dumps({"bundle": bundle.path.name, "version": bundle.version})
    outcome = AgentOutcome(
        exit_code=None if timed_out else exit_code, timed_out=timed_out, logs=logs
    )
    if not timed_out and exit_code not in (None, 0):
        marker = next((m for m in crash_markers if m in logs.get("stderr", "")), None)
        if exit_code >= 126 or marker is not None:
            why = f"its stderr has {marker!r}" if marker else "it could not run or was killed"
            raise ScaffoldCrashed(
                f"the scaffold crashed (exit code {exit_code}; {why}): "
                f"{logs.get('stderr', '')[-1500:]}",
                outcome=outcome,
            )
    return outcome


async def _upload_files(sandbox: Sandbox, files: Mapping[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="slr-agent-") as tmp:
        root = Path(tmp) / "agent"
        root.mkdir()
        for rel, text in files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        await sandbox.exec(f"rm -rf {AGENT_DIR}", timeout_s=30)
        await sandbox.upload(root, AGENT_DIR)


async def collect_logs(sandbox: Sandbox, paths: Sequence[str]) -> dict[str, str]:
    """Text of every file under ``paths`` in the sandbox, keyed by its path there."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="slr-logs-") as tmp:
        for i, src in enumerate(paths):
            probe = await sandbox.exec(f"test -e {src}", timeout_s=30)
            if probe.exit_code != 0:
                continue
            dest = Path(tmp) / str(i)
            try:
                await sandbox.download(src, dest)
            except (SandboxError, OSError) as exc:
                log.warning("could not collect agent logs", path=src, error=str(exc))
                continue
            files = [dest] if dest.is_file() else sorted(p for p in dest.rglob("*") if p.is_file())
            for f in files:
                key = src if f == dest else f"{src.rstrip('/')}/{f.relative_to(dest)}"
                out[key] = _cut(f.read_bytes().decode("utf-8", errors="replace"))
    return out


def _cut(text: str) -> str:
    if len(text) <= MAX_LOG_CHARS:
        return text
    return text[:MAX_LOG_CHARS] + f"\n[... {len(text) - MAX_LOG_CHARS} more characters cut]"


def openai_base_url(base_url: str) -> str:
    """The base URL an OpenAI client wants: it ends in ``/v1``."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def anthropic_base_url(base_url: str) -> str:
    """The base URL an Anthropic client wants: the root it appends ``/v1/messages`` to."""
    return base_url.rstrip("/").removesuffix("/v1")


async def bundle_root(sandbox: Sandbox, bundle: Bundle) -> str:
    """Where ``bundle`` is in ``sandbox``: the trial runner's mount point
    (``slr.contracts.BUNDLE_MOUNT``) when it holds this bundle; else the host path when the
    sandbox sees it (a backend that mounts at the same path, or shares the host's files);
    else the mount point (a bundle without a marker, such as a package folder)."""

    script = (
        f"if {Marker.shell_test(BUNDLE_MOUNT, bundle.version)}; "
        f"then echo {BUNDLE_MOUNT}; elif [ -d {shlex.quote(str(bundle.path))} ]; "
        f"then echo {shlex.quote(str(bundle.path))}; else echo {BUNDLE_MOUNT}; fi"
    )
    probe = await sandbox.exec(script, timeout_s=30)
    return probe.stdout.strip() or BUNDLE_MOUNT


#: What an uncaught Python exception prints: a crash of a Python scaffold.
PYTHON_CRASH = "Traceback (most recent call last)"


# -- the shared part of an adapter: bundle -> command -> files -> run -> logs ----------------

#: The shell word that expands to the trial's instruction (uploaded as a file: no quoting
#: or argument-length limits).
INSTRUCTION_ARG = f'"$(cat {AGENT_DIR}/instruction.md)"'


class HeadlessScaffold(Protocol):
    """What ``run_scaffold`` needs from an adapter: its bundle, and the command line and
    environment that run it against ``endpoint`` with the bundle at ``root``."""

    def bundle(self) -> Bundle: ...

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]: ...


def shell_line(argv: Sequence[str], *tail: str) -> str:
    """``argv`` quoted for the shell, then ``tail`` words as they are (e.g.
    ``INSTRUCTION_ARG``), with stdin closed (headless CLIs otherwise wait on it)."""
    return " ".join([*(shlex.quote(a) for a in argv), *tail, "</dev/null"])


def driver_files(package: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """The files of a scaffold run by a driver script shipped in ``package``
    (``driver.py``) with its ``settings`` (``settings.json``), for ``driver_command``."""
    from importlib.resources import files

    return {
        "driver.py": files(package).joinpath("driver.py").read_text(),
        "settings.json": json.dumps(dict(settings)),
    }


#: What follows the interpreter in ``driver_command``: the driver and its settings.
DRIVER_ARGV = (f"{AGENT_DIR}/driver.py", f"{AGENT_DIR}/settings.json")


def driver_command(python: str) -> str:
    """Run the driver of ``driver_files`` on ``python`` (the bundle's interpreter)."""
    return shlex.join([python, *DRIVER_ARGV]) + " </dev/null"


async def run_scaffold(
    adapter: HeadlessScaffold,
    sandbox: Sandbox,
    instruction: str,
    endpoint: Endpoint,
    *,
    timeout_s: float,
    files: Mapping[str, str] | None = None,
    logs_from: Sequence[str] = (),
    python: bool = False,
    cleanup: Callable[[str], str] | None = None,
    prestarted: Prestarted | None = None,
) -> AgentOutcome:
    """An adapter's whole ``run``: find its bundle in ``sandbox``, build the command and
    environment (``adapter.command(root, endpoint)``), upload the instruction
    (``AGENT_DIR/instruction.md``) and ``files`` (relative to ``AGENT_DIR``), run it headless under
    ``timeout_s`` and gather ``logs_from`` and the bundle's version into the logs.

    ``python``: a Python scaffold (an uncaught exception is a crash). ``cleanup``: given the
    bundle's ``root``, a shell line run after the scaffold ended, timed out or not, to end
    what it started outside its own process tree (e.g. a tmux server, which daemonizes).
    ``prestarted``: the driver's interpreter, already started in this sandbox by the warm
    pool (``slr.agents.prestart``); the driver (``DRIVER_ARGV``) runs in it instead of in a
    fresh ``python``. When it turns out not to be waiting, the command runs afresh.
    """
    bundle = adapter.bundle()
    root = await bundle_root(sandbox, bundle)
    command, env = adapter.command(root, endpoint)

    def run(line: str) -> Awaitable[AgentOutcome]:
        return run_headless(
            sandbox,
            command=line,
            env=env,
            timeout_s=timeout_s,
            bundle=bundle,
            files={"instruction.md": instruction, **(files or {})},
            logs_from=logs_from,
            cleanup=cleanup(root) if cleanup is not None else None,
            crash_markers=[PYTHON_CRASH] if python else (),
        )

    if prestarted is None or not prestarted.alive:
        return await run(command)
    try:
        outcome = await run(prestarted.command(DRIVER_ARGV))
    except ScaffoldCrashed as exc:
        await _add_interpreter_logs(prestarted, exc.outcome)
        raise
    if outcome.exit_code == UNAVAILABLE_EXIT and UNAVAILABLE in outcome.logs.get("stderr", ""):
        log.warning("the prestarted interpreter was gone; starting the scaffold afresh")
        await prestarted.close()
        return await run(command)
    await _add_interpreter_logs(prestarted, outcome)
    return outcome


async def _add_interpreter_logs(prestarted: Prestarted, outcome: AgentOutcome) -> None:
    """What the prestarted interpreter printed before its launch (import warnings), which a
    fresh start would have printed into the scaffold's own output."""
    ended = await prestarted.finished()
    if ended is None:
        await prestarted.close()
        return
    text = (ended.stdout + ended.stderr).strip()
    if text:
        outcome.logs["prestart"] = _cut(text)
