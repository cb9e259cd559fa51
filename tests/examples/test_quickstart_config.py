"""The quickstart's config resolves, its tasks are what make_tasks.py writes, and a sample
of them passes check-tasks (oracle 1, nop 0) on the local backend. The training run itself
is `bash examples/quickstart/run.sh`, not a test."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "quickstart"
SLR = str(Path(sys.executable).with_name("slr"))
SKILLS = ("write", "mkdir", "delete", "rename", "copy", "append")


def test_config_resolves_with_its_prompt_and_tasks(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository root
    config = load_config(HERE / "slr.toml", plugins=get_plugin_manager())
    assert (config.agent.name, config.backend.name) == ("mini-swe-agent", "local")
    assert (ROOT / config.agent.options.config_file).is_file()
    train = load_tasks(config.tasks.path)
    heldout = load_tasks(HERE / "tasks" / "heldout")
    assert len(train) == 36 and len(heldout) == 18
    # held-out = the same skills, names and words no training task uses
    train_words = {w for t in train for w in t.id.split("-")[1:]}
    assert all(not set(t.id.split("-")[1:]) & train_words for t in heldout)


def test_committed_tasks_are_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(HERE / "make_tasks.py"), str(tmp_path)], check=True)
    cmp = filecmp.dircmp(HERE / "tasks", tmp_path)
    stack, diffs = [cmp], []
    while stack:
        c = stack.pop()
        diffs += c.left_only + c.right_only + c.diff_files
        stack += c.subdirs.values()
    assert not diffs, f"re-run examples/quickstart/make_tasks.py and commit: {diffs}"


def test_one_task_per_skill_and_split_passes_check_tasks(tmp_path):
    tasks = tmp_path / "tasks"
    for split, word in (("train", "apple-red"), ("heldout", "music-star")):
        for skill in SKILLS:
            name = f"{skill}-{word}"
            shutil.copytree(HERE / "tasks" / split / name, tasks / name)
    out = subprocess.run(
        [SLR, "check-tasks", str(tasks), "--backend", "local", "--json",
         "--backend-opt", f"cache_dir={tmp_path / 'cache'}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 2 * 2 * len(SKILLS)
    assert {r["agent"]: r["reward"]["value"] for r in rows if r["task_id"] == "copy-apple-red"} == {
        "oracle": 1.0,
        "nop": 0.0,
    }


def test_mini_config_file_is_passed_after_the_builtin_one_and_a_missing_one_is_named(tmp_path):
    import pytest
    from slr_adapter_mini_swe_agent.adapter import MiniSweAgent, MiniSweAgentConfig

    from slr.contracts import Endpoint
    from slr.errors import UsageError

    agent = MiniSweAgent(MiniSweAgentConfig(config_file=str(HERE / "mini.yaml")))
    assert agent.config_text == (HERE / "mini.yaml").read_text()
    endpoint = Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m")
    command, _ = agent.command("/opt/slr/agent", endpoint)
    builtin, user = command.index("mini_textbased.yaml"), command.index("mini/config.yaml")
    assert builtin < user  # mini merges its -c configs in order: ours wins
    with pytest.raises(UsageError, match="agent.config_file = .*nope.yaml"):
        MiniSweAgent(MiniSweAgentConfig(config_file=str(tmp_path / "nope.yaml")))


def test_the_lora_variant_is_the_same_run_with_an_adapter(monkeypatch):
    """slr-lora.toml differs from slr.toml only in its run name and [optimizer]: a LoRA
    adapter with verl's option names, and a learning rate for one."""
    import tomllib

    monkeypatch.chdir(ROOT)
    full, lora = (tomllib.loads((HERE / n).read_text()) for n in ("slr.toml", "slr-lora.toml"))
    assert lora["run"].pop("name") == "quickstart-lora" and full["run"].pop("name")
    options = lora.pop("optimizer")
    full.pop("optimizer")
    assert lora == full
    config = load_config(HERE / "slr-lora.toml", plugins=get_plugin_manager())
    assert config.optimizer.options.lora_rank > 0
    assert config.optimizer.options.lr > 3e-5 and options["target_modules"] == "all-linear"
