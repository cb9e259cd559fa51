"""``slr plugins``: every installed plugin, its distribution, version and registrations."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from slr.plugins import KINDS, get_plugin_manager


def collect() -> list[dict]:
    manager = get_plugin_manager()
    rows = {
        name: {
            "plugin": name,
            "distribution": info.distribution,
            "version": info.version,
            "registers": {},
        }
        for name, info in manager.plugins.items()
    }
    for kind in KINDS:
        for reg in manager.registry(kind).values():
            row = rows[reg.plugin.name]
            row["registers"].setdefault(kind, []).append(reg.name)
    return sorted(rows.values(), key=lambda r: r["plugin"])


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json: bool) -> None:
    """List installed plugins: distribution, version, and what each registered.

    Plugins are found through the ``slr`` entry-point group; set SLR_LOAD_PLUGINS to a
    comma-separated list of plugin or distribution names to load only those.
    """
    rows = collect()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("plugin", "distribution", "version", "registers", title="slr plugins")
    for row in rows:
        regs = "; ".join(
            f"{KINDS[k].noun}: {', '.join(sorted(names))}" for k, names in row["registers"].items()
        )
        table.add_row(row["plugin"], row["distribution"] or "-", row["version"] or "-", regs or "-")
    Console().print(table)
    if not rows:
        click.echo("No plugins installed. Try: pip install slr-adapter-opencode")
