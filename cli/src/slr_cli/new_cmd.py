"""``slr new adapter``: a new agent-adapter distribution from the bundled template."""

from __future__ import annotations

import re
import string
from importlib.resources import files
from pathlib import Path

import click

from slr.errors import UsageError

NAME = re.compile(r"^[a-z][a-z0-9-]*[a-z0-9]$")


def render_adapter(name: str, dest: Path) -> Path:
    """Write the ``slr-adapter-<name>`` distribution into ``dest/slr-adapter-<name>``."""
    if not NAME.match(name):
        raise UsageError(
            f"adapter name {name!r} is not valid: use lowercase letters, digits and dashes, "
            f"e.g. 'my-agent'"
        )
    values = {
        "name": name,
        "dist": f"slr-adapter-{name}",
        "package": "slr_adapter_" + name.replace("-", "_"),
    }
    out = dest / values["dist"]
    if out.exists():
        raise UsageError(f"{out} already exists; pick another --dest or remove it")
    template = files("slr_cli") / "templates" / "adapter"
    _copy(template, out, values)
    return out


def _copy(src, out: Path, values: dict[str, str]) -> None:
    for entry in src.iterdir():
        if entry.name == "__pycache__":
            continue
        name = entry.name.replace("__package__", values["package"]).removesuffix(".tmpl")
        if entry.is_dir():
            _copy(entry, out / name, values)
        else:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            text = string.Template(entry.read_text()).substitute(values)
            (out / name).write_text(text)


@click.group()
def new() -> None:
    """Start a new plugin distribution from a template."""


@new.command()
@click.argument("name")
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder to create the distribution in.",
)
def adapter(name: str, dest: Path) -> None:
    """Create slr-adapter-NAME: an agent adapter for a scaffold of your own.

    The result installs with `pip install ./slr-adapter-NAME`, registers NAME through the
    `slr` entry-point group, and has a test that runs slr's AgentAdapterTests on it. See
    CONTRIBUTING.md for the walkthrough.
    """
    out = render_adapter(name, dest)
    click.echo(f"created {out}\nnext: pip install -e {out} && slr plugins")
