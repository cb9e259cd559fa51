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
    task = load_task(EXAMPLES / "hello-world")  # memory_mb = 512, storage_mb = 1024

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
    assert f["as"] == str(512 * 1024 * ADDRESS_SPACE_FACTOR)  # no memory group: kB
    assert "slr-limits" not in f.get("pids", "") + f.get("memory", "")


def test_auto_uses_control_groups_where_writable(tmp_path):
    f, _ = _probe(tmp_path, "auto")
    if not Path("/sys/fs/cgroup/pids/cgroup.procs").exists():
        pytest.skip("no writable pids hierarchy on this machine")  # pragma: no cover
    assert "slr-limits" in f["pids"] and "slr-limits" in f["memory"], f
    assert f["as"] == "unlimited"  # the memory group bounds memory; no address-space cap


def test_off_sets_nothing(tmp_path):
    f, _ = _probe(tmp_path, "off")
    assert f["fsize"] == "unlimited" and f["as"] == "unlimited"


def test_a_missing_prlimit_is_a_clear_error(tmp_path, monkeypatch):
    from slr.contracts import SandboxError

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "prlimit" else which(name))
    with pytest.raises(SandboxError, match="prlimit .*util-linux"):
        _probe(tmp_path, "rlimits")
