"""slr.agents.headless.run_scaffold, the adapters' shared run, in a real local sandbox (bubblewrap).

The "scaffold" here is a line of shell: what is under test is the helper's part (the bundle
found where it is mounted, the instruction and files uploaded, the command's environment,
crash detection, the adapter's cleanup after it, the logs and the bundle's version collected).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend

from slr.agents.headless import (
    AGENT_DIR,
    INSTRUCTION_ARG,
    ScaffoldCrashed,
    run_scaffold,
    shell_line,
)
from slr.contracts import BUNDLE_MOUNT, Bundle, Endpoint
from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
ENDPOINT = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")


class ShellScaffold:
    """An adapter whose scaffold is ``script`` (shell), run from its bundle folder."""

    def __init__(self, bundle: Path, script: str) -> None:
        self.path, self.script = bundle, script

    def bundle(self) -> Bundle:
        return Bundle(path=self.path, version="7.1")

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        return shell_line(["bash", f"{root}/run.sh", endpoint.model], INSTRUCTION_ARG), {
            "SLR_TEST_KEY": endpoint.api_key
        }


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("headless")
    b = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap", workspace_dir=str(root / "ws"), cache_dir=str(root / "cache")
        )
    )
    yield b
    asyncio.run(b.close())


def run(backend, tmp_path, script: str, *, timeout_s: float = 60, **kw):
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "run.sh").write_text(script)
    adapter = ShellScaffold(bundle, script)

    async def go():
        sandbox = await backend.start(
            load_task(EXAMPLES / "hello-world"),
            trial_id=f"headless-{tmp_path.name[-8:]}",
            labels={"slr.test": "headless"},
            mounts={bundle: BUNDLE_MOUNT},
        )
        try:
            return await run_scaffold(
                adapter, sandbox, "say hi", ENDPOINT, timeout_s=timeout_s, **kw
            )
        finally:
            await sandbox.stop()

    return asyncio.run(go())


def test_shell_line_quotes_the_argv_and_closes_stdin():
    line = shell_line(["a b", "c'd"], "--", INSTRUCTION_ARG)
    assert line == f"'a b' 'c'\"'\"'d' -- {INSTRUCTION_ARG} </dev/null"


def test_run_scaffold_uploads_runs_and_collects(backend, tmp_path):
    script = (
        'echo "model=$1 task=$2 key=$SLR_TEST_KEY"; '
        f"cat {AGENT_DIR}/extra.txt; echo log-line > {AGENT_DIR}/own.log"
    )
    outcome = run(
        backend,
        tmp_path,
        script,
        files={"extra.txt": "extra file\n"},
        logs_from=[f"{AGENT_DIR}/own.log"],
    )
    assert outcome.exit_code == 0 and not outcome.timed_out
    assert "model=m task=say hi key=k" in outcome.logs["stdout"]
    assert "extra file" in outcome.logs["stdout"]
    assert outcome.logs[f"{AGENT_DIR}/own.log"] == "log-line\n"
    assert json.loads(outcome.logs["bundle"])["version"] == "7.1"


def test_a_python_traceback_is_a_crash_only_for_a_python_scaffold(backend, tmp_path):
    script = "echo 'Traceback (most recent call last):' >&2; exit 1"
    outcome = run(backend, tmp_path, script)
    assert outcome.exit_code == 1  # an ordinary non-zero exit
    with pytest.raises(ScaffoldCrashed, match="Traceback"):
        run(backend, tmp_path, script, python=True)


def test_the_adapters_cleanup_runs_with_the_bundle_root_even_after_a_timeout(backend, tmp_path):
    # What a scaffold leaves outside its process tree (a daemon) is its adapter's to end:
    # the helper runs the adapter's line, made from where the bundle is, after a timeout too.
    seen = f"{AGENT_DIR}/cleanup.log"
    outcome = run(
        backend,
        tmp_path,
        "echo started; sleep 600",
        timeout_s=2,
        cleanup=lambda root: f"test -f {root}/run.sh && echo cleaned > {seen}",
        logs_from=[seen],
    )
    assert outcome.timed_out and outcome.exit_code is None
    assert outcome.logs.get(seen) == "cleaned\n", outcome.logs
