"""``slr models``: prepare model caches ahead of time (CI runs ``slr models pull`` once)."""

from __future__ import annotations

import click

from slr_engine_hf.config import DEFAULT_MODEL


@click.group()
def models() -> None:
    """Models for the embedded ``hf`` engine."""


@models.command()
@click.argument("model", default=DEFAULT_MODEL)
def pull(model: str) -> None:
    """Convert MODEL once into the cache and print its folder.

    MODEL is a packaged model name (default: smollm2-135m-instruct) or a .gguf file.
    Nothing is downloaded: the packaged model comes from an installed PyPI package.
    """
    from slr_engine_hf.models import ensure_model

    click.echo(str(ensure_model(model)))


@models.command(name="path")
@click.argument("model", default=DEFAULT_MODEL)
def path_cmd(model: str) -> None:
    """Print the folder MODEL is (or would be) cached in, without converting it."""
    from slr_engine_hf.models import PACKAGED, cache_dir

    if model not in PACKAGED:
        raise click.BadParameter(f"{model!r} is not a packaged model ({', '.join(PACKAGED)})")
    click.echo(str(cache_dir() / "models" / model))
