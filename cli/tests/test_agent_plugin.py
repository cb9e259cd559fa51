"""The Claude Code plugin (/rl:check, /rl:run, /rl:status, /rl:dashboard): the real Claude
Code binary (the claude-code bundle's, offline) validates it and installs it with
`slr agent-plugin install`; its skills' shell commands are `slr` commands only, and each is
run here as the skill writes it, a real (tiny) training run launched in the background
included."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from slr_cli.agent_plugin_cmd import MARKETPLACE, PLUGIN, SKILLS

ROOT = Path(__file__).resolve().parents[2]
SLR = str(Path(sys.executable).with_name("slr"))
PLUGIN_DIR = MARKETPLACE / PLUGIN
FENCE = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def skill(name: str) -> str:
    return (PLUGIN_DIR / "skills" / name / "SKILL.md").read_text()


def commands(name: str) -> list[str]:
    """The shell lines of a skill's ```bash blocks, as the skill tells Claude to run them."""
    return [
        line.strip()
        for block in FENCE.findall(skill(name))
        for line in block.splitlines()
        if line.strip()
    ]


@pytest.fixture(scope="module")
def claude() -> Path:
    """The real Claude Code binary: the claude-code bundle (built once, cached)."""
    from slr_adapter_claude_code.adapter import ClaudeCode

    return ClaudeCode().bundle().path / "node_modules" / ".bin" / "claude"


def offline_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "NO_COLOR": "1",
    }


@pytest.mark.timeout(300)
def test_claude_code_validates_the_marketplace_and_the_plugin_strictly(claude, tmp_path):
    env = offline_env(tmp_path)
    for target in (MARKETPLACE, PLUGIN_DIR):
        res = subprocess.run(
            [str(claude), "plugin", "validate", str(target), "--strict", "--json"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        report = json.loads(res.stdout)
        assert res.returncode == 0 and report["success"], res.stdout + res.stderr
    assert sorted(report["provides"]["skills"]) == sorted(f"{PLUGIN}:{s}" for s in SKILLS)


@pytest.mark.timeout(300)
def test_slr_agent_plugin_install_puts_it_into_claude_code(claude, tmp_path):
    env = offline_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    for _ in range(2):  # installing again is a no-op, not an error
        res = subprocess.run(
            [SLR, "agent-plugin", "install", "--claude", str(claude)],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        assert "/rl:check, /rl:run, /rl:status, /rl:dashboard" in res.stdout
    listed = subprocess.run(
        [str(claude), "plugin", "list", "--json"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    [rl] = [p for p in json.loads(listed.stdout) if p["id"] == f"{PLUGIN}@slr"]
    assert rl["enabled"] and rl["scope"] == "user"
    project = tmp_path / "project"
    project.mkdir()
    res = subprocess.run(
        [SLR, "agent-plugin", "install", "--scope", "project", "--claude", str(claude)],
        capture_output=True, text=True, timeout=120, env=env, cwd=project,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    settings = json.loads((project / ".claude" / "settings.json").read_text())
    assert settings["enabledPlugins"] == {f"{PLUGIN}@slr": True}


def test_a_missing_claude_binary_is_one_line_with_the_fix(tmp_path):
    res = subprocess.run(
        [SLR, "agent-plugin", "install", "--claude", str(tmp_path / "no-claude")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "is not an executable; give the claude binary" in res.stderr


def test_the_skills_run_slr_commands_and_nothing_else():
    for name in SKILLS:
        lines = commands(name)
        assert lines, f"skill {name} has no ```bash block"
        for line in lines:
            words = line.split()
            assert words[words[0] == "nohup"] == "slr", f"{name}: {line!r} is not an slr command"
        allowed = re.search(r"^allowed-tools: (.+)$", skill(name), re.MULTILINE)
        assert allowed is not None
        for tool in allowed.group(1).split(", "):
            assert tool == "Read" or re.fullmatch(r"Bash\((nohup )?slr [a-z-]+:\*\)", tool), tool


# -- the skills' commands, run as written ----------------------------------------------------


def run_line(line: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


def write_config(tmp_path: Path, model: Path) -> Path:
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f"""
[run]
name = "skill"
runs_dir = "{tmp_path / "runs"}"
steps = 1
[tasks]
path = "{ROOT / "examples" / "tasks"}"
include = ["hello-world"]
[rollout]
tasks_per_step = 1
n_per_task = 2
concurrency = 2
max_tokens = 8
[agent]
name = "oracle"
[backend]
name = "local"
workspace_dir = "{tmp_path / "ws"}"
[engine]
name = "hf"
model = "{model}"
"""
    )
    return cfg


def wait_for_exit(pid: int, timeout: float) -> None:
    """Block until process ``pid`` (not our child: nohup'd by the skill's shell) ends."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still runs after {timeout} s"
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_check_run_and_status_skills_launch_and_report_a_real_run(tmp_path):
    from slr_testkit import tiny

    model, tok = tiny.tiny_model(hidden=32, layers=1)
    config = write_config(tmp_path, tiny.save(model, tok, tmp_path / "model"))
    run = tmp_path / "runs" / "skill-20261130-101500"
    env = {**os.environ, "CONFIG": str(config), "RUN": str(run), "RUNS": str(tmp_path / "runs")}
    env["PATH"] = f"{Path(SLR).parent}{os.pathsep}{env['PATH']}"

    # /rl:check: the preflight (JSON lines, nothing fatal), then the runs folder
    preflight, runs_status = commands("check")
    (tmp_path / "runs").mkdir()
    res = run_line(preflight, env, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    checks = {json.loads(line)["check"]: json.loads(line) for line in res.stdout.splitlines()}
    assert {"runs-in-flight", "proxy-reach", "hf-model", "tasks"} <= set(checks)
    assert not [c for c in checks.values() if c["status"] == "fatal"]
    assert json.loads(run_line(runs_status, env, tmp_path).stdout) == []

    # /rl:run: preflight, then the launch in the background, then its status
    preflight, launch, status = commands("run")
    assert run_line(preflight, env, tmp_path).returncode == 0
    res = run_line(f"{launch}\necho $!", env, tmp_path)
    assert res.returncode == 0, res.stderr
    wait_for_exit(int(res.stdout.split()[-1]), timeout=240)
    log = Path(f"{run}.log").read_text()
    info = json.loads(run_line(status, env, tmp_path).stdout)
    assert info["state"] == "completed", log[-3000:]
    assert info["path"] == str(run) and info["steps_done"] == 1 and info["trials"] == 2
    assert info["live"] is None and info["reward_mean"] == 1.0

    # /rl:status on the runs folder: its newest run, the one just made
    [status] = commands("status")
    assert json.loads(run_line(status, {**env, "RUN": env["RUNS"]}, tmp_path).stdout)[
        "path"
    ] == str(run)


@pytest.mark.timeout(120)
def test_the_dashboard_skill_starts_it_and_finds_its_url(tmp_path):
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "runs").mkdir()
    env = {**os.environ, "RUNS": str(tmp_path / "runs"), "PORT": str(port)}
    env["PATH"] = f"{Path(SLR).parent}{os.pathsep}{env['PATH']}"  # the skill runs `slr`
    [start] = commands("dashboard")
    log = tmp_path / "runs" / "dashboard.log"
    log.touch()  # so the reader below may open it before the shell's redirection runs
    res = run_line(f"{start}\necho $!", env, tmp_path)
    pid = int(res.stdout.split()[-1])
    try:
        fd = os.pidfd_open(pid)
        url = None
        with open(log) as fh:
            # read the log as it grows until the URL line, or the server ends
            while url is None:
                line = fh.readline()
                if line.startswith("dashboard: "):
                    url = line.split()[1]
                elif not line:
                    ended, _, _ = select.select([fd], [], [], 0.05)
                    assert not ended, f"slr dashboard ended: {log.read_text()[-2000:]}"
        os.close(fd)
        assert urllib.request.urlopen(url, timeout=30).status == 200
    finally:
        os.kill(pid, 15)
