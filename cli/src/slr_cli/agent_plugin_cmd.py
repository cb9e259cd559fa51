"""``slr agent-plugin``: the Claude Code plugin (/rl:check, /rl:run, /rl:status,
/rl:dashboard) that ships in this package, and its installation into Claude Code.

The plugin is a Claude Code marketplace folder (``agent_plugin/``: the marketplace
manifest and one plugin, ``rl``, whose skills run only ``slr`` commands). Installing it is
Claude Code's own ``claude plugin install rl --marketplace FOLDER``: the plugin loads in
place from this package, so upgrading slr upgrades it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import click

from slr.errors import UsageError

#: The marketplace folder (``.claude-plugin/marketplace.json``) and the plugin in it.
MARKETPLACE = Path(__file__).with_name("agent_plugin")
MARKETPLACE_NAME = "slr"
PLUGIN = "rl"
SKILLS = ("check", "run", "status", "dashboard")
INSTALL_TIMEOUT_S = 120


def find_claude(given: str | None) -> Path:
    """``--claude``, else ``claude`` on PATH, else the newest built claude-code bundle's."""
    if given:
        found = shutil.which(given)
        if found is None:
            raise UsageError(f"--claude {given!r} is not an executable; give the claude binary")
        return Path(found)
    on_path = shutil.which("claude")
    if on_path:
        return Path(on_path)
    from slr.agents.bundles import bundles_dir

    built = sorted(bundles_dir().glob("claude-code-*/node_modules/.bin/claude"))
    if built:
        return built[-1]
    raise UsageError(
        "no Claude Code here: `claude` is not on PATH and no claude-code bundle is built; "
        "install it (npm install -g @anthropic-ai/claude-code), run `slr bundles build "
        "claude-code`, or pass --claude PATH"
    )


def install(claude: Path, scope: str) -> dict:
    """Run ``claude plugin install`` for the plugin; its JSON result, or a one-line error."""
    argv = [str(claude), "plugin", "install", PLUGIN, "--marketplace", str(MARKETPLACE)]
    argv += ["--scope", scope, "--json"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"`{' '.join(argv)}` did not run ({exc})") from None
    lines = [line for line in res.stdout.splitlines() if line.strip().startswith("{")]
    result = {}
    if lines:
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError:
            result = {}
    if res.returncode != 0 or result.get("outcome") != "ok":
        said = result.get("message") or (res.stderr or res.stdout).strip()[-300:]
        raise UsageError(
            f"Claude Code refused the plugin ({claude} exited {res.returncode}: {said}); "
            f"check `{claude} plugin validate {MARKETPLACE}`"
        )
    return result


@click.group("agent-plugin")
def agent_plugin() -> None:
    """The Claude Code plugin: /rl:check, /rl:run, /rl:status, /rl:dashboard.

    \b
    Examples:
      slr agent-plugin install                    for this user, every project
      slr agent-plugin install --scope project    for the current project only
      slr agent-plugin path                       the marketplace folder itself

    Its skills run only `slr` commands (preflight, run in the background, status,
    dashboard), so `slr` must be on the PATH of the shell Claude Code runs in.
    """


@agent_plugin.command("path")
def path_() -> None:
    """Print the plugin's marketplace folder (for `claude plugin marketplace add`)."""
    click.echo(str(MARKETPLACE))


@agent_plugin.command("install")
@click.option(
    "--scope",
    type=click.Choice(["user", "project", "local"]),
    default="user",
    show_default=True,
    help="Claude Code's installation scope: user (every project), project (this "
    "project's .claude/settings.json, shared), local (this project, this user).",
)
@click.option(
    "--claude",
    "claude_bin",
    metavar="PATH",
    help="The claude binary (default: claude on PATH, else the built claude-code bundle's).",
)
def install_(scope: str, claude_bin: str | None) -> None:
    """Install the plugin into Claude Code (again: a no-op)."""
    claude = find_claude(claude_bin)
    result = install(claude, scope)
    click.echo(result.get("message") or f"installed {PLUGIN}@{MARKETPLACE_NAME} ({scope})")
    where = "this project" if scope != "user" else "every project"
    commands = ", ".join(f"/{PLUGIN}:{s}" for s in SKILLS)
    click.echo(f"in Claude Code ({where}): {commands}; `slr` must be on its PATH")
    if shutil.which("slr") is None:
        click.echo("warning: `slr` is not on PATH here; activate its environment first", err=True)
