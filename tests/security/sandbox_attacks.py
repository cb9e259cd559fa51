"""What the sandbox attack tests share: the bait task, the hostile agent, the probes.

The bait task hides a different marker in each place an agent must not read: its tests,
its solution, its repository's original history (an old commit, a deleted branch, a tag,
a commit left only in the reflog). The hostile agent runs shell scripts in the agent
phase, as a cheating scaffold would, and keeps their output for the test to judge.

Every probe contacts only this machine: loopback listeners the test itself opens.
"""

from __future__ import annotations

import asyncio
import shutil
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import attrs

from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, ExecResult, Sandbox

TESTS_SECRET = "slr-sec-tests-5b1e"
SOLUTION_SECRET = "slr-sec-solution-c2d9"
HISTORY_SECRET = "slr-sec-history-7f3a"
# What the scripts grep for is spelled in two parts, so that no command line (visible in
# /proc) and no script file holds the whole word.
HALVES = {s: (s[:8], s[8:]) for s in (TESTS_SECRET, SOLUTION_SECRET, HISTORY_SECRET)}

_MAKE_REPO = """\
#!/bin/sh
# A repository whose history holds the answer: an old commit, a deleted branch, a tag and
# a commit reachable only from the reflog. The agent phase must see none of it.
set -eu
cd /app
git init -q -b main
git config user.name dev && git config user.email dev@bait.invalid
echo "the fix is {h}" > answer.txt
git add -A && git commit -q -m "fix: {h}"
git tag -a v1 -m "{h}"
git branch fix
git rm -q answer.txt && git commit -q -m "remove the answer"
git branch -D fix
echo "{h} again" > dangling.txt && git add dangling.txt && git commit -q -m "{h} dangling"
git reset -q --hard HEAD~1
git gc -q --prune=never
git config --unset user.name && git config --unset user.email
echo "print('work here')" > main.py
"""

_TEST_SH = """\
#!/bin/bash
# {t}
mkdir -p /logs/verifier
# 1 when no process the agent left is still running (markers on their command lines)
if grep -qs 'slr-sec-[l]ingerer' /proc/[0-9]*/cmdline; then echo 0; else echo 1; fi \\
  > /logs/verifier/reward.txt
"""


def make_bait_task(folder: Path, *, memory_mb: int = 512, storage_mb: int = 1024):
    """The bait task in ``folder`` (its image is cached across runs: fixed contents)."""
    from slr.tasks import load_task

    if folder.exists():
        shutil.rmtree(folder)
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "environment" / "Dockerfile").write_text(
        "FROM slr-base:bookworm\nWORKDIR /app\nCOPY make-repo.sh /tmp/make-repo.sh\n"
        "RUN sh /tmp/make-repo.sh && rm /tmp/make-repo.sh\n"
    )
    (folder / "environment" / "make-repo.sh").write_text(_MAKE_REPO.format(h=HISTORY_SECRET))
    (folder / "tests" / "test.sh").write_text(_TEST_SH.format(t=TESTS_SECRET))
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {SOLUTION_SECRET}\n")
    (folder / "instruction.md").write_text("Print the answer.\n")
    (folder / "task.toml").write_text(
        textwrap.dedent(
            f"""\
            version = "1.0"
            [verifier]
            timeout_sec = 60.0
            [agent]
            timeout_sec = 120.0
            [environment]
            memory_mb = {memory_mb}
            storage_mb = {storage_mb}
            allow_internet = false
            [slr]
            squash_git_history = true
            restore_git_history = true
            """
        )
    )
    return load_task(folder)


def grep_for(secret: str, where: str = "/") -> str:
    """A shell snippet printing the files under ``where`` that hold ``secret``."""
    a, b = HALVES[secret]
    return (
        f"grep -rlas --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr "
        f'"{a}""{b}" {where} 2>/dev/null | head -5'
    )


Script = Callable[[Sandbox, Endpoint], Awaitable[dict[str, ExecResult]]]


@attrs.define
class HostileAgent(AgentAdapter):
    """Runs attack scripts (name -> shell) in the agent phase and keeps what they printed.

    ``before`` / ``after`` let a test line the agent up with another trial (events, not
    sleeps)."""

    scripts: dict[str, str] = attrs.field(factory=dict)
    before: Callable[[], Awaitable[None]] | None = None
    after: Callable[[], Awaitable[None]] | None = None
    timeout_s: float = 60.0
    protocol = "openai"
    needs_model = False
    accepts_task = False
    results: dict[str, ExecResult] = attrs.field(factory=dict)
    endpoint: Endpoint | None = None

    def bundle(self) -> Bundle:
        return Bundle(path=Path("/nonexistent-slr-bundle"), version="hostile")

    async def run(
        self, sandbox: Sandbox, instruction: str, endpoint: Endpoint, *, timeout_s: float
    ) -> AgentOutcome:
        self.endpoint = endpoint
        if self.before is not None:
            await self.before()
        try:
            for name, script in self.scripts.items():
                self.results[name] = await sandbox.exec(
                    script, timeout_s=self.timeout_s, env={"SLR_PROXY_URL": endpoint.base_url}
                )
        finally:
            if self.after is not None:
                await self.after()
        return AgentOutcome(exit_code=0)

    def out(self, name: str) -> str:
        r = self.results[name]
        return r.stdout.strip()

    def fields(self, name: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.out(name).splitlines() if "=" in line)


def events() -> tuple[asyncio.Event, asyncio.Event]:
    return asyncio.Event(), asyncio.Event()


def host_paths_probe(paths: Sequence[Path | str]) -> str:
    """A script that tries to read each host path from inside (prints what it could)."""
    lines = [f'cat "{p}" 2>/dev/null && echo "readable={p}"' for p in paths]
    lines += [f'ls -d "{p}" 2>/dev/null && echo "exists={p}"' for p in paths]
    return "\n".join(lines) + "\ntrue"
