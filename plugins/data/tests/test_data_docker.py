"""slr-data on the real docker daemon: mine and synth a small repository the test builds,
import a record pointing at it, and validate the tasks (oracle 1, nop 0) end to end.

One image per task; the tiny repository keeps each build to a few seconds."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import ClassVar

import pytest
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker.backend import DockerBackend
from slr_backend_docker.base_image import BASE_TAG
from slr_data.curate_cmds import classify
from slr_data.harbor import write_task
from slr_data.mine import mine
from slr_data.records import read_records
from slr_data.synth import synth

from slr.agents.model_free import NopAgent, OracleAgent
from slr.plugins import get_plugin_manager
from slr.rollout.trial import StandInSessions, run_trial
from slr.tasks import load_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def backend():
    b = DockerBackend(DockerBackendConfig())
    assert b.client.images.get(BASE_TAG), f"run `slr images base` first ({BASE_TAG})"
    yield b
    asyncio.run(b.close())


def check(backend, task, agents=None):
    verifier = get_plugin_manager().get("verifier", "harbor").create()

    async def go():
        out = {}
        for name, agent in (agents or {"oracle": OracleAgent(), "nop": NopAgent()}).items():
            out[name] = [
                await run_trial(
                    task,
                    backend=backend,
                    agent=agent,
                    verifier=verifier,
                    session_factory=StandInSessions(),
                    agent_name=name,
                )
            ]
        return out

    return asyncio.run(go())


@pytest.mark.timeout(300)
def test_mine_keeps_fix_commits_with_tests_that_really_flip(tmp_path, calc_repo, backend):
    repo, shas = calc_repo
    results = asyncio.run(mine(repo, tmp_path / "tasks", backend, base_image=BASE_TAG))
    by = {r.name: r for r in results}
    # the docs-only commit and the root commit are not candidates at all
    assert set(by) == {f"calc-{shas['fix'][:10]}", f"calc-{shas['feature'][:10]}"}
    fix = by[f"calc-{shas['fix'][:10]}"]
    assert fix.task is not None, fix.reason
    config = json.loads((fix.task / "tests" / "config.json").read_text())
    # v1's clamp returns `high` for anything below it: both clamp tests flip
    assert config["fail_to_pass"] == [
        "tests/test_ops.py::test_clamp_edges",
        "tests/test_ops.py::test_clamp_inside",
    ]
    assert config["pass_to_pass"] == [
        "tests/test_ops.py::test_add",
        "tests/test_ops.py::test_add_negative",
    ]
    task = load_task(fix.task)
    verdict, why = classify(**check(backend, task))
    assert verdict == "ok", why


@pytest.mark.timeout(300)
def test_synth_makes_bugs_the_tests_catch(tmp_path, calc_repo, backend):
    repo, _ = calc_repo
    results = asyncio.run(
        synth(repo, tmp_path / "tasks", backend, base_image=BASE_TAG, max_tasks=1, max_tries=30)
    )
    kept = [r for r in results if r.task]
    assert len(kept) == 1, [r.reason for r in results]
    task = load_task(kept[0].task)
    config = json.loads((task.tests_dir / "config.json").read_text())
    assert config["fail_to_pass"]
    verdict, why = classify(**check(backend, task))
    assert verdict == "ok", why


@pytest.mark.timeout(300)
def test_imported_task_runs_and_hides_the_future(tmp_path, calc_repo, backend):
    """A SWE-bench record on the local repository: oracle 1, nop 0, and the agent phase
    sees neither the fix commit nor the hidden tests nor the solution."""
    repo, shas = calc_repo

    def diff(*paths: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "diff", shas["v1"], shas["fix"], "--", *paths],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    rec = {
        "repo": str(repo),
        "instance_id": "calc-1",
        "base_commit": shas["v1"],
        "patch": diff("calc"),
        "test_patch": diff("tests"),
        "problem_statement": "clamp",
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_clamp_edges"]),
        "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_add"]),
        "hints_text": "",
        "created_at": "",
        "version": "1",
        "environment_setup_commit": "",
    }
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    (inst,) = read_records(src, "swe-bench")
    task = load_task(write_task(inst, tmp_path / "tasks", repo_dir=repo, add_pytest=True))

    class Snoop(NopAgent):
        seen: ClassVar[dict[str, str]] = {}

        async def run(self, sandbox, instruction, endpoint, *, timeout_s):
            for name, cmd in {
                "log": "git -c safe.directory='*' log --all --format=%H",
                "grep": "git -c safe.directory='*' grep -c 'value > high' $(git -c safe.directory='*' rev-list --all) || true",
                "hidden": "ls /tests /solution 2>&1; grep -rl test_clamp_edges / --include=*.py 2>/dev/null | grep -v ^/proc || true",
            }.items():
                Snoop.seen[name] = (await sandbox.exec(cmd, user="root")).stdout
            return await super().run(sandbox, instruction, endpoint, timeout_s=timeout_s)

    out = check(backend, task, {"oracle": OracleAgent(), "nop": Snoop()})
    verdict, why = classify(oracle=out["oracle"], nop=out["nop"])
    assert verdict == "ok", why
    assert shas["fix"] not in Snoop.seen["log"] and shas["v1"] not in Snoop.seen["log"]
    assert Snoop.seen["grep"].strip() == ""
    assert "test_clamp_edges" not in Snoop.seen["hidden"] and "No such file" in Snoop.seen["hidden"]
