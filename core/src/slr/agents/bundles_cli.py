"""``slr bundles``: build agent runtime bundles ahead of time (CI, a fresh machine).

Agent adapters add this group through their ``register_commands`` hook with
``add_bundles_command(cli)``; it is added once however many adapters are installed.
"""

from __future__ import annotations

import json
import time

import attrs
import click

from slr.agents import bundles
from slr.errors import SlrError
from slr.plugins import get_plugin_manager


def add_bundles_command(cli: click.Group) -> None:
    if "bundles" not in cli.commands:
        cli.add_command(bundles_group)


@click.group("bundles")
def bundles_group() -> None:
    """Agent runtime bundles (npm packages, a Python with packages), built once and reused."""


@bundles_group.command("build")
@click.argument("names", nargs=-1)
def build(names: tuple[str, ...]) -> None:
    """Build the bundles of the agents NAMES (default: every installed agent).

    Each bundle lands in $SLR_CACHE_DIR/bundles (default ~/.cache/slr/bundles) and is a
    no-op when already built. Uses each agent's default options.
    """
    registry = get_plugin_manager().registry("agent")
    for name in names or sorted(registry):
        if name not in registry:
            get_plugin_manager().get("agent", name)  # raises with the installed names
        reg = registry[name]
        adapter = reg.create(reg.config_cls() if reg.config_cls is not None else None)
        started = time.monotonic()
        try:
            bundle = adapter.bundle()
        except SlrError:
            raise
        except Exception as exc:
            raise SlrError(f"building the bundle of agent {name!r} failed: {exc}") from exc
        took = time.monotonic() - started
        click.echo(f"{name}: {bundle.path} (version {bundle.version}, {took:.1f}s)")


@bundles_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per bundle.")
def list_(as_json: bool) -> None:
    """List the built bundles in the cache folder."""
    rows = []
    for path in sorted(bundles.bundles_dir().glob(f"*/{bundles.MARKER}")):
        marker = bundles.Marker.read(path.parent)
        if marker is not None:  # an unreadable marker: not a bundle; `build` redoes it
            rows.append({**attrs.asdict(marker), "path": str(path.parent)})
    for row in rows:
        click.echo(json.dumps(row) if as_json else f"{row['name']} {row['version']} {row['path']}")
    if not rows and not as_json:
        click.echo(f"no bundles built yet in {bundles.bundles_dir()}; run `slr bundles build`")
