"""The docs, READMEs and help text advertise only what exists: every distribution they name is
a member of this workspace (scripts/members.py), and a component that is not here yet
(a verl FSDP / Megatron optimizer) is only ever named as
planned or absent, never as something to install or configure."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: distribution-name prefixes of this workspace's plugin kinds
DIST = re.compile(
    r"\bslr-(?:core|data|engine|optimizer|adapter|backend|logger|verifier|toolparsers)"
    r"(?:-[a-z0-9]+)*(?![-\w<*])"
)
#: made-up names the plugin-writing guide uses as examples of *your* distribution
EXAMPLES = {"slr-adapter-my-agent", "slr-adapter-foo"}
#: components that do not exist yet, and the words that say so
ABSENT = re.compile(r"optimizer-verl|megatron|verl on ray", re.IGNORECASE)
SAYS_ABSENT = re.compile(r"planned|not yet|not shipped|not here|does not exist", re.IGNORECASE)


def _members() -> set[str]:
    folders = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "members.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        tomllib.loads((ROOT / f / "pyproject.toml").read_text())["project"]["name"] for f in folders
    }


def _docs() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for group in ("plugins", "adapters", "sandbox_backends", "loggers", "examples"):
        pages += sorted((ROOT / group).glob("*/README.md"))
    return [p for p in pages if p.exists()]


def _help_sources() -> list[Path]:
    """Where ``--help`` and the config reference come from: the CLI and the config classes."""
    return [
        *sorted((ROOT / "cli" / "src").rglob("*.py")),
        *sorted((ROOT / "core" / "src" / "slr" / "config").rglob("*.py")),
        *sorted(ROOT.glob("plugins/*/src/*/config.py")),
    ]


def test_every_distribution_named_in_the_docs_is_a_workspace_member():
    members = _members()
    unknown = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in [*_docs(), *_help_sources()]
        for name in DIST.findall(page.read_text())
        if name not in members and name not in EXAMPLES
    }
    assert not unknown, f"named but not in scripts/members.py: {sorted(unknown)}"


def test_components_that_do_not_exist_are_only_named_as_planned():
    bad = []
    for page in _docs():
        for paragraph in re.split(r"\n\s*\n", page.read_text()):
            if ABSENT.search(paragraph) and not SAYS_ABSENT.search(paragraph):
                bad.append(f"{page.relative_to(ROOT)}: {paragraph.strip()[:120]!r}")
    for source in _help_sources():
        for n, line in enumerate(source.read_text().splitlines(), 1):
            if ABSENT.search(line):
                bad.append(f"{source.relative_to(ROOT)}:{n}: {line.strip()!r}")
    assert not bad, "say 'planned' or remove:\n" + "\n".join(bad)


def test_plugin_names_in_help_text_are_installed_plugins():
    """``--engine`` / ``--optimizer`` / ... help lists names a user can pass today."""
    import click

    from slr.config import PLUGIN_SECTIONS
    from slr.plugins import PluginManager
    from slr_cli.main import cli

    plugins = PluginManager()
    listed = re.compile(r"plugin(?::|, e\.g\.)\s*([^(]*?)\s*(?:\(|\.?$)")
    commands: list[click.Command] = [cli]
    seen = 0
    while commands:
        command = commands.pop()
        if isinstance(command, click.Group):
            commands += command.commands.values()
        for param in command.params:
            kind = PLUGIN_SECTIONS.get(param.name or "")
            match = listed.search(getattr(param, "help", None) or "")
            if kind is None or match is None:
                continue
            for name in filter(None, re.split(r",\s*", match.group(1))):
                seen += 1
                assert name in plugins.registry(kind), (
                    f"{command.name} --{param.name} help names {name!r}, not an installed "
                    f"{kind} (installed: {sorted(plugins.registry(kind))})"
                )
    assert seen >= 5  # the check found the lists it is about
