"""The local backend's resource limits: what each mode sets, and that nothing is left.

The attacks themselves (fork bomb, memory hog, disk fill, open files) are in
tests/security/test_sandbox_attacks.py; here, the settings as a command sees them.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend
from slr_backend_local.limits import ADDRESS_SPACE_FACTOR

from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
pytestmark = pytest.mark.timeout(120)

PROBE = (
    "echo nofile=$(ulimit -n) fsize=$(ulimit -f) as=$(ulimit -v); "
    "grep -E ':(pids|memory):' /proc/self/cgroup | sed 's/.*:\\(pids\\|memory\\):/\\1=/'"
)


def _probe(tmp_path, limits: str, **kw) -> tuple[dict[str, str], LocalBackend]:
    backend = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(tmp_path / "ws"),
            cache_dir=str(tmp_path / "cache"),
            limits=limits,  # type: ignore[arg-type]
            **kw,
        )
    )
    task = load_task(EXAMPLES / "hello-world")  # memory_mb = 2048, storage_mb = 1024

    async def go():
        sb = await backend.start(task, trial_id="limits", labels={})
        try:
            res = await sb.exec(PROBE)
            groups = list(sb.limits.groups.folders) if sb.limits else []
        finally:
            await sb.stop()
        return res, groups

    res, groups = asyncio.run(go())
    assert res.exit_code == 0, res.stderr
    fields = dict(kv.split("=", 1) for kv in res.stdout.split())
    assert not any(g.exists() for g in groups), "a sandbox's control group outlived it"
    return fields, backend


def test_rlimits_only(tmp_path):
    f, _ = _probe(tmp_path, "rlimits", open_files=321)
    assert f["nofile"] == "321"
    assert f["fsize"] == str(1024 * 1024)  # storage_mb, in bash's 1024-byte blocks
    assert f["as"] == str(2048 * 1024 * ADDRESS_SPACE_FACTOR)  # no memory group: kB
    assert "slr-limits" not in f.get("pids", "") + f.get("memory", "")


def test_auto_uses_control_groups_where_writable(tmp_path):
    f, _ = _probe(tmp_path, "auto")
    if not Path("/sys/fs/cgroup/pids/cgroup.procs").exists():
        pytest.skip("no writable pids hierarchy on this machine")  # pragma: no cover
    assert "slr-limits" in f["pids"] and "slr-limits" in f["memory"], f
    assert f["as"] == "unlimited"  # the memory group bounds memory; no address-space cap


def test_a_command_killed_by_the_memory_limit_says_so(tmp_path):
    """Exit status 137 alone reads like any kill (a timeout, a stop): the command's stderr
    names the memory limit and the task setting that raises it."""
    task_dir = tmp_path / "small"
    shutil.copytree(EXAMPLES / "hello-world", task_dir)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("memory_mb = 2048", "memory_mb = 64"))
    backend = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(tmp_path / "ws"),
            cache_dir=str(tmp_path / "cache"),
            limits="auto",
        )
    )
    hog = "python3 -c 'x = [bytearray(16 << 20) for _ in range(32)]'"

    async def go():
        sb = await backend.start(load_task(task_dir), trial_id="oom", labels={})
        try:
            if sb.limits is None or not sb.limits.groups.memory:
                # only an address-space rlimit bounds memory then: nothing counts OOM kills
                pytest.skip(
                    "no memory control group could be made on this machine"
                )  # pragma: no cover
            return await sb.exec(hog), await sb.exec("echo fine")
        finally:
            await sb.stop()

    killed, after = asyncio.run(go())
    assert killed.exit_code != 0, killed
    assert "memory limit (64 MB" in killed.stderr and "memory_mb" in killed.stderr
    assert after.exit_code == 0 and "memory limit" not in after.stderr


def test_off_sets_nothing(tmp_path):
    f, _ = _probe(tmp_path, "off")
    assert f["fsize"] == "unlimited" and f["as"] == "unlimited"


def test_a_missing_prlimit_is_a_clear_error(tmp_path, monkeypatch):
    from slr.contracts import SandboxError

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "prlimit" else which(name))
    with pytest.raises(SandboxError, match="prlimit .*util-linux"):
        _probe(tmp_path, "rlimits")
