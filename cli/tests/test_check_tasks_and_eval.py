"""`slr check-tasks` and `slr eval` with the core's model-free agents, run as a user runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"
SLR = str(Path(sys.executable).with_name("slr"))


def slr(*args, cwd):
    return subprocess.run([SLR, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture
def local_opts(tmp_path):
    return ["--backend", "local", "--backend-opt", f"cache_dir={tmp_path / 'cache'}"]


def test_check_tasks_passes_sound_tasks_and_fails_a_broken_one(tmp_path, local_opts):
    tasks = tmp_path / "tasks"
    shutil.copytree(EXAMPLES / "hello-world", tasks / "hello-world")
    shutil.copytree(EXAMPLES / "hello-world", tasks / "always-passes")
    # A task whose tests pass whatever the agent does: nop scores 1, so the check fails.
    (tasks / "always-passes" / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    )
    good = slr("check-tasks", str(tasks / "hello-world"), *local_opts, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "hello-world" in good.stdout and "ok" in good.stdout
    both = slr("check-tasks", str(tasks), *local_opts, "--json", cwd=tmp_path)
    assert both.returncode == 1
    rows = {(r["task_id"], r["agent"]): r for r in json.loads(both.stdout)}
    assert rows[("always-passes", "nop")]["reward"]["value"] == 1.0
    assert rows[("hello-world", "nop")]["reward"]["value"] == 0.0


def eval_opts(tmp_path):
    """`slr eval` takes the backend's options as config: --set backend.KEY=VALUE."""
    return [
        "--backend",
        "local",
        "--set",
        f"backend.cache_dir={json.dumps(str(tmp_path / 'cache'))}",
        "--set",
        f"run.runs_dir={json.dumps(str(tmp_path / 'runs'))}",
    ]


def test_eval_runs_the_oracle_without_a_model_and_it_scores_one(tmp_path):
    res = slr(
        "eval",
        "--agent",
        "oracle",
        "--tasks",
        str(EXAMPLES / "count-lines"),
        "-k",
        "2",
        *eval_opts(tmp_path),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "count-lines" in res.stdout and "1.00" in res.stdout
    assert "hf engine ready" not in res.stderr  # no model is loaded for a model-free agent
    (run,) = (tmp_path / "runs").iterdir()
    assert len(list((run / "trials").glob("*.json"))) == 2
    summary = json.loads((run / "eval.json").read_text())
    assert summary["pass_at"] == {"1": 1.0, "2": 1.0}
    assert summary["tasks"]["count-lines"]["n"] == 2 and summary["engine"] is None


def test_eval_with_an_unknown_agent_lists_the_installed_ones(tmp_path):
    res = slr(
        "eval",
        "--agent",
        "no-such-agent",
        "--tasks",
        str(EXAMPLES),
        *eval_opts(tmp_path),
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "unknown agent 'no-such-agent'" in res.stderr
    assert "oracle" in res.stderr


def test_eval_refuses_a_checkpoint_for_an_agent_that_calls_no_model(tmp_path):
    res = slr(
        "eval",
        "--agent",
        "oracle",
        "--tasks",
        str(EXAMPLES / "hello-world"),
        "--checkpoint",
        str(tmp_path),
        *eval_opts(tmp_path),
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr
    assert "calls no model, so --checkpoint has nothing to serve" in res.stderr


def test_an_interrupted_eval_resumes_running_only_the_missing_trials(tmp_path):
    out = tmp_path / "ev"
    args = ["--agent", "oracle", "--tasks", str(EXAMPLES / "hello-world"), "-k", "3"]
    first = slr("eval", *args, *eval_opts(tmp_path), "--output", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    kept = {p.name: p.read_bytes() for p in (out / "trials").glob("*.json")}
    assert sorted(kept) == ["hello-world-0.json", "hello-world-1.json", "hello-world-2.json"]
    # as if killed after two trials: one record and the summary are missing
    (out / "trials" / "hello-world-1.json").unlink()
    (out / "eval.json").unlink()
    del kept["hello-world-1.json"]
    res = slr("eval", "--resume", str(out), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["trials"] == 3 and summary["pass_at"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    after = {p.name: p.read_bytes() for p in (out / "trials").glob("*.json")}
    assert {k: after[k] for k in kept} == kept and "hello-world-1.json" in after
    events = [
        e["event"]
        for e in json.loads("[" + ",".join((out / "events.jsonl").read_text().splitlines()) + "]")
    ]
    assert events == ["started", "finished", "resumed", "started", "finished"]
    refused = slr("eval", "--resume", str(out), "-k", "5", cwd=tmp_path)
    assert refused.returncode == 2 and "--resume finishes an eval" in refused.stderr
