"""Prestarted interpreters (slr.agents.prestart) in real local sandboxes (bubblewrap).

The "scaffold" is a small Python driver on the host's ``python3`` (the sandbox sees the
host's ``/usr``) with a module standing in for its heavy imports; the module writes the
pid that imported it, so a test can tell whether the driver ran in the interpreter that
imported it ahead of the trial (prestarted) or in a fresh one.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend

from slr.agents.headless import AGENT_DIR, ScaffoldCrashed, driver_command, run_scaffold
from slr.agents.prestart import PRESTART_DIR, Prestarted, start_interpreter, take
from slr.agents.prestart_main import FREEZE_IMPORTS_ENV
from slr.contracts import BUNDLE_MOUNT, Bundle, Endpoint
from slr.sandboxing.pool import SandboxPool
from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
ENDPOINT = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="trial-key", model="m")
PYTHON = "/usr/bin/python3"

HEAVY = """\
import gc, os
IMPORTED_BY = os.getpid()
with open("/tmp/heavy-imported-by", "a") as fh:
    fh.write(f"{IMPORTED_BY}\\n")
with open("/tmp/heavy-gc", "w") as fh:  # was the collector on while it was imported?
    fh.write("on" if gc.isenabled() else "paused")
"""

# The driver: reports what it sees, then does what its settings say.
DRIVER = """\
import gc, json, os, sys, time
settings = json.load(open(sys.argv[1]))
print(json.dumps({
    "gc": [gc.isenabled(), gc.get_freeze_count() > 0],
    "pid": os.getpid(),
    "preloaded": "heavy" in sys.modules,
    "key": os.environ.get("SLR_TEST_KEY"),
    "static": os.environ.get("SLR_TEST_STATIC"),
    "cwd": os.getcwd(),
    "argv": sys.argv,
    "name": __name__,
    "stdin": sys.stdin.read(),
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if settings["do"] == "hang":
    time.sleep(3600)
if settings["do"] == "raise":
    raise RuntimeError("the driver broke")
sys.exit(settings.get("exit", 0))
"""


class DriverScaffold:
    """An adapter whose driver is ``DRIVER`` on the host's python, with ``heavy`` on its path."""

    def __init__(self, bundle: Path) -> None:
        self.path = bundle

    def bundle(self) -> Bundle:
        return Bundle(path=self.path, version="1")

    def env(self, root: str) -> dict[str, str]:
        return {"PYTHONPATH": root, "SLR_TEST_STATIC": "static"}

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        return driver_command(PYTHON), {**self.env(root), "SLR_TEST_KEY": endpoint.api_key}


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("prestart")
    b = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap", workspace_dir=str(root / "ws"), cache_dir=str(root / "cache")
        )
    )
    yield b
    asyncio.run(b.close())


@pytest.fixture
def adapter(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "heavy.py").write_text(HEAVY)
    return DriverScaffold(bundle)


async def _sandbox(backend, adapter, name: str):
    return await backend.start(
        load_task(EXAMPLES / "hello-world"),
        trial_id=f"prestart-{name}",
        labels={"slr.test": "prestart"},
        mounts={adapter.path: BUNDLE_MOUNT},
    )


async def _prestart(sandbox, adapter, modules=("heavy",), env=None) -> Prestarted | None:
    return await start_interpreter(
        sandbox, python=PYTHON, modules=modules, env={**adapter.env(BUNDLE_MOUNT), **(env or {})}
    )


async def _run(sandbox, adapter, settings: dict, prestarted, *, timeout_s: float = 60):
    files = {"driver.py": DRIVER, "settings.json": json.dumps(settings)}
    return await run_scaffold(
        adapter,
        sandbox,
        "hi",
        ENDPOINT,
        timeout_s=timeout_s,
        files=files,
        python=True,
        prestarted=prestarted,
    )


def _seen(outcome) -> dict:
    return json.loads(outcome.logs["stdout"].splitlines()[0])


@pytest.mark.timeout(60)
def test_the_driver_runs_in_the_interpreter_that_imported_ahead_as_a_fresh_one_would(
    backend, adapter
):
    async def go():
        sandbox = await _sandbox(backend, adapter, "same")
        try:
            prestarted = await _prestart(sandbox, adapter)
            assert prestarted is not None and prestarted.alive
            warm = await _run(sandbox, adapter, {"do": "exit", "exit": 3}, prestarted)
            imported_by = await sandbox.exec("cat /tmp/heavy-imported-by")
            # the interpreter served its one launch and ended
            ended = await asyncio.wait_for(asyncio.shield(prestarted.server), 15)
            cold = await _run(sandbox, adapter, {"do": "exit", "exit": 3}, None)
            return warm, imported_by.stdout.split(), ended, cold
        finally:
            await sandbox.stop()

    warm, imported_by, ended, cold = asyncio.run(go())
    seen, fresh = _seen(warm), _seen(cold)
    # imported once, ahead, by the very process that then ran the driver
    assert seen["preloaded"] and imported_by == [str(seen["pid"])]
    assert not fresh["preloaded"]
    # what the driver sees is what a fresh `python driver.py settings.json` sees
    for key in ("key", "static", "cwd", "argv", "name", "stdin"):
        assert seen[key] == fresh[key], key
    assert seen["key"] == "trial-key" and seen["name"] == "__main__" and seen["stdin"] == ""
    assert seen["argv"] == [f"{AGENT_DIR}/driver.py", f"{AGENT_DIR}/settings.json"]
    assert warm.exit_code == cold.exit_code == 3 and not warm.timed_out
    assert warm.logs["stderr"] == cold.logs["stderr"] == "to stderr\n"
    assert ended.exit_code == 3
    # without SLR_FREEZE_IMPORTS, Python's own collector settings throughout
    assert seen["gc"] == fresh["gc"] == [True, False]


@pytest.mark.timeout(60)
def test_frozen_imports_pause_the_collector_for_the_import_and_hand_the_driver_it_on(
    backend, adapter
):
    async def go():
        sandbox = await _sandbox(backend, adapter, "frozen")
        try:
            prestarted = await _prestart(sandbox, adapter, env={FREEZE_IMPORTS_ENV: "1"})
            assert prestarted is not None
            warm = await _run(sandbox, adapter, {"do": "exit"}, prestarted)
            during = await sandbox.exec("cat /tmp/heavy-gc")
            return warm, during.stdout
        finally:
            await sandbox.stop()

    warm, during = asyncio.run(go())
    assert during == "paused"  # the heavy import ran with the collector paused
    # and the driver runs with it on again, the import's objects frozen out of its scans
    assert _seen(warm)["gc"] == [True, True] and warm.exit_code == 0


@pytest.mark.timeout(60)
def test_a_timeout_kills_the_prestarted_interpreter_and_a_crash_is_a_crash(backend, adapter):
    async def go():
        sandbox = await _sandbox(backend, adapter, "kill")
        try:
            prestarted = await _prestart(sandbox, adapter)
            assert prestarted is not None
            hung = await _run(sandbox, adapter, {"do": "hang"}, prestarted, timeout_s=3)
            # the launcher's death is the interpreter's lifeline: it ends, not waited out
            killed = await asyncio.wait_for(asyncio.shield(prestarted.server), 15)
            again = await _prestart(sandbox, adapter)
            with pytest.raises(ScaffoldCrashed) as crash:
                await _run(sandbox, adapter, {"do": "raise"}, again)
            return hung, killed, crash.value
        finally:
            await sandbox.stop()

    hung, killed, crash = asyncio.run(go())
    assert hung.timed_out and hung.exit_code is None
    assert _seen(hung)["preloaded"]  # its output up to the kill is kept
    assert killed.exit_code == 137
    assert "RuntimeError: the driver broke" in crash.outcome.logs["stderr"]
    assert crash.outcome.exit_code == 1


@pytest.mark.timeout(60)
def test_an_interpreter_that_cannot_start_or_is_gone_falls_back_to_a_fresh_start(backend, adapter):
    async def go():
        sandbox = await _sandbox(backend, adapter, "gone")
        try:
            broken = await _prestart(sandbox, adapter, modules=("heavy", "no_such_module"))
            # an optional module ("?") that does not import is skipped
            prestarted = await _prestart(sandbox, adapter, modules=("heavy", "?no_such_module"))
            assert prestarted is not None
            # its socket gone (it cannot be reached): the launch finds nobody waiting
            await sandbox.exec(f"rm {PRESTART_DIR}/sock")
            outcome = await _run(sandbox, adapter, {"do": "exit"}, prestarted)
            return broken, outcome, prestarted
        finally:
            await sandbox.stop()

    broken, outcome, prestarted = asyncio.run(go())
    assert broken is None
    assert outcome.exit_code == 0 and not _seen(outcome)["preloaded"]  # a fresh start
    assert not prestarted.alive


@pytest.mark.timeout(60)
def test_the_pool_prestarts_each_sandbox_and_hands_the_interpreter_out_once(tmp_path, adapter):
    task = load_task(EXAMPLES / "hello-world")
    backend = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(tmp_path / "ws"),
            cache_dir=str(tmp_path / "cache"),
        )
    )

    async def go():
        pool = SandboxPool(
            backend,
            size=2,
            mounts={adapter.path: BUNDLE_MOUNT},
            prestart=lambda sandbox: _prestart(sandbox, adapter),
        )
        await pool.prepare(task)
        pool.expect([task, task])
        await pool.wait_ready()
        mounts = {adapter.path: BUNDLE_MOUNT}
        sandbox = await pool.start(task, trial_id="t1", labels={}, mounts=mounts)
        prestarted = take(sandbox)
        assert prestarted is not None and prestarted.alive and take(sandbox) is None
        outcome = await _run(sandbox, adapter, {"do": "exit"}, prestarted)
        await sandbox.stop()
        unused = await pool.start(task, trial_id="t2", labels={}, mounts=mounts)
        other = take(unused)
        assert other is not None and other is not prestarted
        await unused.stop()  # a trial that never launched it: it ends with its sandbox
        await asyncio.wait([other.server], timeout=15)
        await pool.close()
        return outcome, other

    outcome, other = asyncio.run(go())
    assert _seen(outcome)["preloaded"]
    assert not other.alive
    assert not (tmp_path / "ws").exists() or list((tmp_path / "ws").iterdir()) == []
