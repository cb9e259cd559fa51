"""Harbor task folders: loading, validation errors that name the file and the field."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import structlog.testing

from slr.errors import UsageError
from slr.tasks import BrokenTaskError, content_hash, load_task, load_tasks, write_index

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture
def task_dir(tmp_path):
    dst = tmp_path / "hello"
    shutil.copytree(EXAMPLES / "hello-world", dst)
    return dst


def _set_toml(task_dir: Path, text: str) -> None:
    (task_dir / "task.toml").write_text(text)


def test_examples_load_with_harbor_fields():
    tasks = {t.id: t for t in load_tasks(EXAMPLES)}
    assert {"hello-world", "count-lines", "fix-median", "make-directory"} <= set(tasks)
    fm = tasks["fix-median"]
    assert fm.name == "slr/fix-median"
    assert fm.agent.timeout_s == 300.0 and fm.verifier.timeout_s == 120.0
    assert fm.environment.memory_mb == 2048 and fm.environment.cpus == 1.0
    assert fm.verifier.network == "none"  # allow_internet = false
    assert fm.squash_git_history and fm.restore_git_history
    assert fm.solution_dir == fm.path / "solution"
    assert "median" in fm.instruction
    for t in tasks.values():
        assert len(t.environment.content_hash) == 64


def test_defaults_follow_harbor(task_dir):
    _set_toml(task_dir, 'version = "1.0"\n')
    t = load_task(task_dir)
    assert t.name == "hello" and t.agent.timeout_s is None
    assert t.agent_timeout_s(default=42) == 42
    assert t.verifier.timeout_s == 600.0 and t.verifier.network == "full"
    assert t.environment.memory_mb == 2048 and t.environment.storage_mb == 10240


def test_legacy_sizes_users_env_templates_and_network(task_dir, monkeypatch):
    monkeypatch.setenv("SLR_TEST_TOKEN", "s3cret")
    _set_toml(
        task_dir,
        "[environment]\n"
        'memory = "2G"\nstorage = "512M"\nnetwork_mode = "no-network"\n'
        'workdir = "/srv/app"\n'
        'env = { TOKEN = "${SLR_TEST_TOKEN}", MODE = "${SLR_TEST_UNSET:-dev}" }\n'
        "[verifier]\nuser = 1000\n"
        '[agent]\nuser = "agent"\n',
    )
    t = load_task(task_dir)
    assert t.environment.memory_mb == 2048 and t.environment.storage_mb == 512
    assert t.environment.env == {"TOKEN": "s3cret", "MODE": "dev"}
    assert t.environment.workdir == "/srv/app"
    assert t.verifier.network == "none" and t.verifier.user == "1000"
    assert t.agent.user == "agent"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[verifier]\ntimeout_sec = "soon"\n',
            r"task\.toml: verifier\.timeout_sec = 'soon'.*a number",
        ),
        ("[agent]\ntimeout_sec = -5\n", r"agent\.timeout_sec = -5.*above 0"),
        ('[environment]\nmemory = "lots"\n', r"environment\.memory = 'lots'.*'512M'"),
        ("[environment]\ncpus = true\n", r"environment\.cpus = True"),
        ('[environment]\nnetwork_mode = "sometimes"\n', r"environment\.network_mode.*'no-network'"),
        ('[environment]\nworkdir = "app"\n', r"workdir = 'app'.*absolute"),
        ("[slr]\nsquash_git_history = 1\n", r"slr\.squash_git_history = 1.*true or false"),
        ("verifier = 3\n", r"\[verifier\] must be a table"),
        ("[verifier\n", r"task\.toml: is not valid TOML"),
    ],
)
def test_a_broken_field_names_the_file_and_the_field(task_dir, toml, message):
    _set_toml(task_dir, toml)
    with pytest.raises(BrokenTaskError, match=message) as err:
        load_task(task_dir)
    assert isinstance(err.value, UsageError)
    assert err.value.path == task_dir.resolve() / "task.toml"


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("tests/test.sh", r"tests/test\.sh: is missing"),
        ("instruction.md", r"instruction\.md: is missing"),
        ("environment/Dockerfile", r"Dockerfile: is missing, and environment\.docker_image"),
        ("task.toml", r"task\.toml: is missing"),
    ],
)
def test_a_missing_file_is_named(task_dir, remove, message):
    (task_dir / remove).unlink()
    with pytest.raises(BrokenTaskError, match=message):
        load_task(task_dir)


def test_a_prebuilt_image_needs_no_dockerfile(task_dir):
    (task_dir / "environment" / "Dockerfile").unlink()
    _set_toml(task_dir, '[environment]\ndocker_image = "slr-base:bookworm"\n')
    assert load_task(task_dir).environment.docker_image == "slr-base:bookworm"


def test_content_hash_is_stable_and_sees_every_change(tmp_path):
    a = tmp_path / "a"
    shutil.copytree(EXAMPLES / "fix-median" / "environment", a)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert content_hash(a) == content_hash(b)
    (b / "repo" / "README.md").write_text("changed\n")
    assert content_hash(a) != content_hash(b)
    c = tmp_path / "c"
    shutil.copytree(a, c)
    os.chmod(c / "repo" / "README.md", 0o755)
    assert content_hash(a) != content_hash(c)


def test_load_tasks_from_folder_include_and_errors(tmp_path):
    assert [t.id for t in load_tasks(EXAMPLES, include=["count-lines"])] == ["count-lines"]
    with pytest.raises(UsageError, match="tasks not found.*nope"):
        load_tasks(EXAMPLES, include=["nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no task folders"):
        load_tasks(tmp_path / "empty")
    assert [t.id for t in load_tasks(EXAMPLES / "hello-world")] == ["hello-world"]


def test_parquet_index_of_pointers_round_trips(tmp_path):
    tasks = load_tasks(EXAMPLES)
    index = write_index(tasks, tmp_path / "index.parquet")
    again = load_tasks(index)
    assert [t.id for t in again] == [t.id for t in tasks]
    assert [t.environment.content_hash for t in again] == [
        t.environment.content_hash for t in tasks
    ]


def test_unknown_and_unsupported_keys_are_warned_not_fatal(task_dir):
    _set_toml(task_dir, "[environment]\ngpus = 1\nfancy = true\n[agent]\nnetwork_mode = 'public'\n")
    with structlog.testing.capture_logs() as logs:
        load_task(task_dir)
    said = {(e["event"], e["key"]) for e in logs}
    assert ("task.toml key not supported by slr, ignored", "environment.gpus") in said
    assert ("unknown task.toml key, ignored", "environment.fancy") in said
    assert ("task.toml key not supported by slr, ignored", "agent.network_mode") in said
