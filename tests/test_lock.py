"""The environment the tests run in is the locked one: every installed third-party package
is in scripts/constraints.txt at the installed version. A dependency added without
re-running scripts/lock fails here, before a fresh machine resolves it differently."""

from __future__ import annotations

import re
import sysconfig
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "scripts" / "constraints.txt"
# pip's own tooling is not part of what the project depends on.
UNLOCKED = {"pip", "setuptools", "wheel"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{LOCK.name}: {line!r} is not an exact pin (NAME==VERSION)"
            pins[_norm(name)] = version
    return pins


def workspace_members() -> set[str]:
    names = set()
    for pyproject in ROOT.glob("*/pyproject.toml"):
        names |= set(re.findall(r'^name = "([^"]+)"', pyproject.read_text(), re.M))
    for pyproject in ROOT.glob("*/*/pyproject.toml"):
        names |= set(re.findall(r'^name = "([^"]+)"', pyproject.read_text(), re.M))
    return {_norm(n) for n in names}


def test_every_installed_package_is_locked_at_its_installed_version():
    pins, ours = locked(), workspace_members()
    assert "slr-core" in ours
    wrong = []
    # The environment's own site-packages: tests may put other folders on sys.path.
    site = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    for dist in metadata.distributions(path=site):
        name = _norm(dist.metadata["Name"])
        if name in ours or name in UNLOCKED:
            continue
        if pins.get(name) != dist.version:
            wrong.append(f"{name} {dist.version} (lock: {pins.get(name, 'missing')})")
    assert not wrong, (
        "installed packages differ from scripts/constraints.txt: "
        + ", ".join(sorted(wrong))
        + ". Install from the lock (bash scripts/setup) or, when the change is on purpose, "
        "re-lock (bash scripts/lock) and commit the new lock."
    )


def test_the_packaged_model_pins_the_locked_release():
    from slr_engine_hf.models import PACKAGED

    pins = locked()
    for spec in PACKAGED.values():
        assert pins[_norm(spec["distribution"])] == spec["version"]
