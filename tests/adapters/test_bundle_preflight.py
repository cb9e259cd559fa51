"""The adapters' bundle checks (`claude-code-bundle`, `opencode-bundle`, and for the Python
bundles `openhands-bundle`, `terminus-bundle`, `mini-swe-agent-bundle`): the real built
bundle's binary runs; a missing bundle warns (the run builds it); a bundle whose binary
fails is fatal."""

from __future__ import annotations

import pytest

from slr.agents.bundle_recipes import python_bundle_version
from slr.agents.bundles import Marker, bundles_dir
from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, run_checks

#: agent -> its binary in the bundle folder
BINARIES = {
    "claude-code": "node_modules/.bin/claude",
    "opencode": "node_modules/.bin/opencode",
    "openhands": "python/bin/python3.12",
    "terminus": "python/bin/python3.12",
    "mini-swe-agent": "python/bin/python3.12",
}


def bundle_folder_version(agent: str, cfg) -> str:
    options = cfg.agent.options
    python = getattr(options, "python", None)
    return python_bundle_version(options.version, python) if python else options.version


def bundle_check(agent: str):
    plugins = get_plugin_manager()
    cfg = load_config(plugins=plugins, choose={"agent": agent, "backend": "local"})
    checks = [c for c in plugins.preflight_checks() if c.name == f"{agent}-bundle"]
    report = run_checks(checks, Context(config=cfg, plugins=plugins), stages=("data",))
    [line] = report.lines
    return line.result, bundle_folder_version(agent, cfg)


@pytest.mark.timeout(120)
def test_the_built_opencode_bundle_runs():
    # the bundle the adapter tests build (ensure: built once, cached)
    from slr_adapter_opencode.adapter import OpenCode

    OpenCode().bundle()
    result, version = bundle_check("opencode")
    assert result.status == "pass", result
    assert version in result.message


@pytest.mark.timeout(300)
def test_the_built_terminus_bundle_has_its_package():
    from slr_adapter_terminus.adapter import Terminus

    built = Terminus().bundle()
    result, _ = bundle_check("terminus")
    assert result.status == "pass", result
    assert "harbor 0.26.0" in result.message
    # the bundle the adapter runs, not an older build of another recipe left in the cache
    assert f"at {built.path}:" in result.message, result.message


@pytest.mark.parametrize("agent", sorted(BINARIES))
def test_a_missing_bundle_warns_and_a_broken_one_is_fatal(agent, tmp_path, monkeypatch):
    monkeypatch.setenv("SLR_CACHE_DIR", str(tmp_path))
    missing, version = bundle_check(agent)
    assert missing.status == "warn" and f"slr bundles build {agent}" in missing.fix
    folder = bundles_dir() / f"{agent}-{version}"
    binary = folder / BINARIES[agent]
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho 'cannot execute: wrong architecture' >&2\nexit 126\n")
    binary.chmod(0o755)
    Marker(name=agent, version=version).write(folder)
    broken, _ = bundle_check(agent)
    assert broken.status == "fatal"
    assert "exits 126 (cannot execute: wrong architecture)" in broken.message
    assert f"slr bundles build {agent}" in broken.fix
