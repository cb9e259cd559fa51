"""``slr data validate / filter / index / stats`` through the CLI.

filter reads an eval run directory written here through ``RunDir`` with rewards chosen in
advance, so every task's pass rate is known; validate runs real trials on the local backend
(a task whose test passes at random, a task whose image does not build).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from slr.contracts import Reward, TrialResult
from slr.run.directory import RunDir

HELLO_TEST = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/hello.txt 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
"""
# passes at random, whatever the agent did: a coin from the kernel per run
COIN_TEST = """#!/bin/bash
mkdir -p /logs/verifier
echo $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) > /logs/verifier/reward.txt
"""


def make_task(
    root: Path, name: str, *, repo: str = "owner/repo", test: str = HELLO_TEST, run: str = ""
) -> Path:
    d = root / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text(
        f'version = "1.0"\n[task]\nname = "t/{name}"\n'
        f'[metadata]\nrepo = "{repo}"\nsource = "test"\n'
        "[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 30.0\n"
        "[environment]\nallow_internet = false\n"
    )
    (d / "instruction.md").write_text("Write hello to /app/hello.txt.\n")
    (d / "environment" / "Dockerfile").write_text(
        "FROM slr-base:bookworm\nWORKDIR /app\n" + (f"RUN {run}\n" if run else "")
    )
    (d / "tests" / "test.sh").write_text(test)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    return d


def invoke(cli, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


# -- filter -------------------------------------------------------------------------------

# successes out of scored trials, by task; "half" also has two infrastructure failures
# that must not count, and "unseen" has no trial at all
RATES = {"never": (0, 4), "quarter": (1, 4), "half": (2, 4), "always": (4, 4)}


@pytest.fixture
def known_rates(tmp_path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks"
    for name in [*RATES, "unseen"]:
        make_task(tasks, name)
    run = RunDir.create(tmp_path / "runs", "ev", "")
    for task, (ok, n) in RATES.items():
        for i in range(n):
            run.write_trial(
                TrialResult(
                    trial_id=f"{task}-{i}",
                    task_id=task,
                    termination="completed",
                    reward=Reward(value=1.0 if i < ok else 0.0),
                )
            )
    for i in range(2):
        run.write_trial(
            TrialResult(trial_id=f"half-infra-{i}", task_id="half", termination="sandbox_error")
        )
    run.close()
    return tasks, run.path


@pytest.mark.parametrize(
    ("band", "kept"),
    [
        (["--min", "0", "--max", "1"], {"quarter": 0.25, "half": 0.5}),
        (["--min", "0.25", "--max", "1"], {"half": 0.5}),
        (["--min", "0.25", "--max", "0.5", "--inclusive"], {"quarter": 0.25, "half": 0.5}),
        (
            ["--min", "0", "--max", "1", "--inclusive"],
            {"never": 0.0, "quarter": 0.25, "half": 0.5, "always": 1.0},
        ),
        (["--min", "0.5", "--max", "0.5", "--inclusive"], {"half": 0.5}),
    ],
)
def test_filter_keeps_exactly_the_band(known_rates, tmp_path, slr_cli, band, kept):
    tasks, run = known_rates
    out = tmp_path / "kept.parquet"
    text = invoke(slr_cli, "data", "filter", str(tasks), "--eval", str(run), *band, "-o", str(out))
    rows = pq.read_table(out).to_pylist()
    assert {r["id"]: r["pass_rate"] for r in rows} == kept
    assert "unseen" in text  # dropped, and said so
    levels = {"never": "hard", "quarter": "hard", "half": "medium", "always": "easy"}
    assert all(r["difficulty"] == levels[r["id"]] for r in rows)


def test_filter_refuses_a_band_that_is_no_band(known_rates, tmp_path, slr_cli):
    tasks, run = known_rates
    out = tmp_path / "k.parquet"
    args = ["data", "filter", str(tasks), "--eval", str(run), "--min", "0.8", "--max", "0.2"]
    result = CliRunner().invoke(slr_cli, [*args, "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "0 <= min <= max <= 1" in str(result.exception) + result.output


NEVER_TEST = """#!/bin/bash
mkdir -p /logs/verifier && echo 0 > /logs/verifier/reward.txt
"""


@pytest.mark.timeout(180)
def test_filter_without_an_eval_runs_one_first(tmp_path, slr_cli):
    """`slr data filter TASKS -k K` with the config's agent: the eval runs here (a real run
    folder, real trials on the local backend), then the band applies to its rates."""
    tasks = tmp_path / "tasks"
    make_task(tasks, "always")
    make_task(tasks, "never", test=NEVER_TEST)
    out = tmp_path / "kept.parquet"
    runs = tmp_path / "runs"
    text = invoke(
        slr_cli,
        "data",
        "filter",
        str(tasks),
        "--agent",
        "oracle",
        "--backend",
        "local",
        "--set",
        f"run.runs_dir={json.dumps(str(runs))}",
        "-k",
        "2",
        "--min",
        "0.5",
        "--max",
        "1",
        "--inclusive",
        "-o",
        str(out),
    )
    assert {r["id"]: r["pass_rate"] for r in pq.read_table(out).to_pylist()} == {"always": 1.0}
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    assert str(folder) in text and len(RunDir.open(folder).trial_ids()) == 4
    # --eval reads an earlier eval: running another one beside it is refused
    result = CliRunner().invoke(
        slr_cli,
        ["data", "filter", str(tasks), "--eval", str(folder), "-k", "3", "-o", str(out)],
    )
    assert result.exit_code != 0 and "drop -c / -k" in str(result.exception) + result.output


# -- index and stats -------------------------------------------------------------------------


def test_index_splits_by_repository_and_stats_summarises_it(tmp_path, slr_cli):
    tasks = tmp_path / "tasks"
    repos = [f"org/r{i}" for i in range(8)]
    for i, repo in enumerate(repos):
        for j in range(3):
            make_task(tasks, f"r{i}-t{j}", repo=repo)
    index = tmp_path / "tasks.parquet"
    invoke(
        slr_cli, "data", "index", str(tasks), "--held-out", "org/r0", "--held-out-fraction", "0.5",
        "-o", str(index),
    )  # fmt: skip
    rows = pq.read_table(index).to_pylist()
    assert len(rows) == 24
    splits: dict[str, set[str]] = {}
    for r in rows:
        splits.setdefault(r["repo"], set()).add(r["split"])
    assert all(len(s) == 1 for s in splits.values()), f"a repository in both splits: {splits}"
    assert splits["org/r0"] == {"held-out"}
    by_split = {s: {r for r, ss in splits.items() if s in ss} for s in ("train", "held-out")}
    assert by_split["train"] and len(by_split["held-out"]) > 1  # the fraction held some out
    assert all((index.parent / r["path"] / "task.toml").is_file() for r in rows)

    summary = json.loads(invoke(slr_cli, "data", "stats", str(index), "--json"))
    assert summary["tasks"] == 24
    assert summary["split"] == {
        "held-out": 3 * len(by_split["held-out"]),
        "train": 3 * len(by_split["train"]),
    }
    assert summary["repo"] == {repo: 3 for repo in repos}
    assert summary["source"] == {"test": 24}
    text = invoke(slr_cli, "data", "stats", str(index))
    assert f"24 tasks in {index}" in text
    assert f"split: held-out {summary['split']['held-out']}, train" in text


def test_index_only_valid_needs_and_follows_the_verdicts(tmp_path, slr_cli):
    tasks = tmp_path / "tasks"
    for name in ("good", "bad"):
        make_task(tasks, name)
    result = CliRunner().invoke(
        slr_cli, ["data", "index", str(tasks), "--only-valid", "-o", str(tmp_path / "i.parquet")]
    )
    assert result.exit_code != 0 and "run `slr data validate" in str(result.exception)
    (tasks / "validation.json").write_text(
        json.dumps({"good": {"verdict": "ok"}, "bad": {"verdict": "flaky"}})
    )
    invoke(slr_cli, "data", "index", str(tasks), "--only-valid", "-o", str(tmp_path / "i.parquet"))
    assert [r["id"] for r in pq.read_table(tmp_path / "i.parquet").to_pylist()] == ["good"]


# -- validate ------------------------------------------------------------------------------


@pytest.mark.slow  # 40 real trials: ~20 s idle, ~45 s on a loaded 2-core machine
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
@pytest.mark.timeout(180)
def test_validate_flags_a_flaky_task_and_says_why_others_are_not_ok(tmp_path, slr_cli):
    tasks = tmp_path / "tasks"
    make_task(tasks, "coin", test=COIN_TEST)
    make_task(tasks, "unbuildable", run="echo no-such-tool-here >&2; exit 3")
    # 10 oracle and 10 nop runs of a fair coin all alike: 4^-9, about 4e-6 (a sound task's
    # "ok" is tested on docker, test_data_docker.py)
    invoke(
        slr_cli, "data", "validate", str(tasks), "-n", "10", "-j", "4", "--backend", "local",
        "--backend-opt", "isolation=bubblewrap",
        "--backend-opt", f"workspace_dir={tmp_path / 'ws'}",
        "--backend-opt", f"cache_dir={tmp_path / 'envs'}",
        code=1,
    )  # fmt: skip
    verdicts = json.loads((tasks / "validation.json").read_text())
    assert verdicts["coin"]["verdict"] == "flaky"
    # the local backend cannot tell a broken RUN from a host without the tool, so it is a
    # sandbox error, not a failing task; the reason is the command's output, said once
    unbuildable = verdicts["unbuildable"]
    assert unbuildable["verdict"] == "error"
    assert "sandbox_error" in unbuildable["why"]
    assert "exit 3: no-such-tool-here" in unbuildable["why"]
    assert unbuildable["why"].count("failed on the local backend") == 1
