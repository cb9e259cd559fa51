"""``slr data mine``: tasks from a repository's own history.

A commit that changes both source and tests is a candidate: base = its parent, the gold
patch = its source diff, the hidden test patch = its test diff. Whether it is a task is
decided by running the tests in the task's own image (``slr_data.execute.TestProbe``):
FAIL_TO_PASS = tests of the changed test files that fail at the base with the new tests and
pass with the fix; PASS_TO_PASS = those that pass both times. A candidate none of whose tests
goes from failing to passing is rejected, with the reason.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from slr.contracts import SandboxError
from slr.tasks import load_task
from slr_data.execute import TestProbe
from slr_data.harbor import git, patch_files, write_task
from slr_data.records import Instance, is_test_path, task_id_of


@frozen(kw_only=True)
class Candidate:
    commit: str
    parent: str
    subject: str
    body: str
    source_files: tuple[str, ...]
    test_files: tuple[str, ...]


@frozen(kw_only=True)
class Outcome:
    """What became of one candidate: a task folder, or the reason it is not one."""

    name: str
    task: Path | None = None
    reason: str = ""
    seconds: float = 0.0
    fail_to_pass: int = 0
    pass_to_pass: int = 0


def candidates(
    repo: Path, *, rev: str = "HEAD", max_commits: int = 200, max_files: int = 8
) -> list[Candidate]:
    """Commits (first-parent, no merges, newest first) that change .py source and tests."""
    out = []
    log = git(
        repo, "log", "--first-parent", "--no-merges", f"-n{max_commits}", "--format=%H %P", rev
    )
    for line in log.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue  # a root commit has no parent to start from
        commit, parent = parts
        names = [n for n in git(repo, "diff", "--name-only", parent, commit).splitlines() if n]
        tests = tuple(n for n in names if is_test_path(n))
        source = tuple(n for n in names if not is_test_path(n))
        if not tests or not any(n.endswith(".py") for n in source) or len(names) > max_files:
            continue
        msg = git(repo, "log", "-1", "--format=%s%n%b", commit)
        subject, _, body = msg.partition("\n")
        out.append(
            Candidate(
                commit=commit,
                parent=parent,
                subject=subject.strip(),
                body=body.strip(),
                source_files=source,
                test_files=tests,
            )
        )
    return out


def statement(subject: str, body: str, fail_to_pass: list[str]) -> str:
    tests = "\n".join(f"- `{t}`" for t in fail_to_pass[:20])
    text = f"{subject}\n\n{body}".strip()
    return (
        f"Make this change to the repository:\n\n{text}\n\n"
        f"When it is done, these tests (some of them not in the repository yet) pass:\n\n{tests}\n"
    )


async def mine(
    repo: Path,
    out: Path,
    backend: Any,
    *,
    name: str | None = None,
    rev: str = "HEAD",
    max_commits: int = 200,
    max_tasks: int | None = None,
    base_image: str,
    add_pytest: bool = True,
    progress: Callable[[Outcome], None] = lambda o: None,
) -> list[Outcome]:
    repo = repo.resolve()
    name = name or repo.name
    results: list[Outcome] = []
    kept = 0
    for cand in candidates(repo, rev=rev, max_commits=max_commits):
        if max_tasks is not None and kept >= max_tasks:
            break
        started = time.monotonic()
        gold = git(repo, "diff", "--binary", cand.parent, cand.commit, "--", *cand.source_files)
        test_patch = git(repo, "diff", "--binary", cand.parent, cand.commit, "--", *cand.test_files)
        inst = Instance(
            instance_id=f"{name}-{cand.commit[:10]}",
            repo=name,
            base_commit=cand.parent,
            problem_statement=cand.subject,
            gold_patch=gold,
            test_patch=test_patch,
            source="mine",
            metadata={"commit": cand.commit},
        )
        outcome = await _decide(inst, cand, repo, out, backend, base_image, add_pytest)
        outcome = attrs.evolve(outcome, seconds=time.monotonic() - started)
        kept += outcome.task is not None
        results.append(outcome)
        progress(outcome)
    return results


async def _decide(inst, cand, repo, out, backend, base_image, add_pytest) -> Outcome:
    name = task_id_of(inst.instance_id)
    run_files = [f for f in patch_files(inst.test_patch) if f.endswith(".py")]
    with tempfile.TemporaryDirectory(prefix="slr-mine-") as tmp:
        folder = write_task(
            inst,
            Path(tmp),
            repo_dir=repo,
            base_image=base_image,
            add_pytest=add_pytest,
        )
        task = load_task(folder)
        try:
            await backend.prepare(task)
            async with TestProbe(backend, task) as probe:
                before = await probe.run(run_files)
                await probe.apply(folder / "solution" / "gold.patch")
                after = await probe.run(run_files)
        except SandboxError as exc:
            return Outcome(name=name, reason=f"could not run the tests: {str(exc)[:300]}")
    if not after:
        return Outcome(name=name, reason="pytest reported no tests after the fix")
    f2p = sorted(t for t, s in after.items() if s == "passed" and before.get(t) != "passed")
    p2p = sorted(t for t, s in after.items() if s == "passed" and before.get(t) == "passed")
    if not f2p:
        return Outcome(name=name, reason="no test fails before the fix and passes after it")
    final = attrs.evolve(
        inst,
        fail_to_pass=tuple(f2p),
        pass_to_pass=tuple(p2p),
        problem_statement=statement(cand.subject, cand.body, f2p),
    )
    folder = write_task(
        final,
        out,
        repo_dir=repo,
        base_image=base_image,
        add_pytest=add_pytest,
        extra_metadata={"commit": cand.commit},
    )
    return Outcome(name=name, task=folder, fail_to_pass=len(f2p), pass_to_pass=len(p2p))
