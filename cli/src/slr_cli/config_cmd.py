"""``slr config``: show the resolved config, print the config reference."""

from __future__ import annotations

import click

from slr.config.cli import config_options, resolve_config
from slr.config.docs import render_reference


@click.group()
def config() -> None:
    """Inspect run configs."""


@config.command()
@config_options
def show(config_path, agent, backend, engine, optimizer, verifier, sets) -> None:
    """Print the resolved config as TOML: the file, the overrides and every default.

    Fails before anything starts when a key or value is invalid, naming the key, the value
    and what is allowed.
    """
    cfg = resolve_config(config_path, agent, backend, engine, optimizer, verifier, sets)
    click.echo(cfg.to_toml(), nl=False)


@config.command()
def reference() -> None:
    """Print the reference of every core config section (Markdown)."""
    click.echo(render_reference(), nl=False)
