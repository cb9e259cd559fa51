"""Run a repository's tests inside a task's own image, through any sandbox backend.

``slr data mine`` and ``synth`` learn FAIL_TO_PASS / PASS_TO_PASS by running the tests, never
by guessing: a ``TestProbe`` starts one sandbox of a (generated) task, applies changes to
the repository, and runs the task's own ``tests/run_tests.py`` with ``--report``.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

from slr.contracts import SandboxError
from slr.rollout.trial import new_trial_id
from slr.sandboxing.labels import trial_labels
from slr.tasks import Task

REPORT = "/tmp/slr-report.json"


class TestProbe:
    """One sandbox of ``task``: run tests, change files, run them again. ``async with``."""

    __test__ = False  # not a pytest class

    def __init__(self, backend: Any, task: Task, *, timeout_s: float = 900.0) -> None:
        self.backend, self.task, self.timeout_s = backend, task, timeout_s
        self.sandbox: Any = None

    async def __aenter__(self) -> TestProbe:
        tid = new_trial_id(f"probe-{self.task.id}")
        self.sandbox = await self.backend.start(
            self.task,
            trial_id=tid,
            labels=trial_labels(run_id=None, trial_id=tid, task_id=self.task.id),
        )
        await self.sandbox.upload(self.task.tests_dir, "/tests")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sandbox is not None:
            await self.sandbox.stop()

    @property
    def workdir(self) -> str:
        return self.task.environment.workdir or "/testbed"

    async def _exec(self, command: str, *, what: str) -> Any:
        try:
            return await self.sandbox.exec(
                command, user="root", cwd=self.workdir, timeout_s=self.timeout_s
            )
        except SandboxError:
            raise
        except Exception as exc:  # a backend's own bug: this candidate fails, not the command
            raise SandboxError(f"{what}: {type(exc).__name__}: {exc}") from exc

    async def sh(self, command: str, *, what: str) -> str:
        res = await self._exec(command, what=what)
        if not res.ok:
            raise SandboxError(
                f"{what} failed (exit {res.exit_code}): {(res.stderr or res.stdout)[-800:]}"
            )
        return res.stdout

    async def apply(self, patch: Path) -> None:
        await self.sandbox.upload(patch, "/tmp/slr-change.patch")
        await self.sh(
            "git -c safe.directory='*' apply --whitespace=nowarn /tmp/slr-change.patch",
            what=f"applying {patch.name}",
        )

    async def write(self, rel: str, text: str, tmp: Path) -> None:
        src = tmp / "file"
        src.write_text(text)
        await self.sandbox.upload(src, f"{self.workdir}/{rel}")

    async def run(self, files: list[str] | None = None, *, reset: bool = True) -> dict[str, str]:
        """Outcome (``passed`` / ``failed``) of every test pytest reports, by test id."""
        args = [
            "python3",
            "/tests/run_tests.py",
            "--config",
            "/tests/config.json",
            "--report",
            REPORT,
        ]
        if not reset:
            args.append("--no-reset")
        if files:
            args += ["--files", *files]
        cmd = " ".join(shlex.quote(a) for a in args)
        await self._exec(cmd, what="running the tests")
        # copied out as a file: a report of thousands of tests is too big to trust to a
        # command's output stream
        with tempfile.TemporaryDirectory(prefix="slr-report-") as tmp:
            local = Path(tmp) / "report.json"
            try:
                await self.sandbox.download(REPORT, local)
                report = json.loads(local.read_text())
            except (OSError, ValueError) as exc:
                raise SandboxError(f"reading the test report failed: {exc}") from exc
        if not report.get("applied", True):
            raise SandboxError("the test patch does not apply at the base commit")
        return dict(report["outcomes"])
