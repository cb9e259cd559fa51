"""``slr images``: images the docker backend needs on machines with no registry."""

from __future__ import annotations

import click

from slr_backend_docker.base_image import BASE_TAG, MIRROR, build_base_image


@click.group()
def images() -> None:
    """Build and inspect sandbox images (docker backend)."""


@images.command()
@click.option("--tag", default=BASE_TAG, show_default=True, help="Tag of the base image.")
@click.option("--mirror", default=MIRROR, show_default=True, help="Debian mirror for debootstrap.")
@click.option("--force", is_flag=True, help="Rebuild even when the tag exists.")
def base(tag: str, mirror: str, force: bool) -> None:
    """Build a Debian bookworm base image with debootstrap (cached: only when missing).

    \b
    Task Dockerfiles use it with `FROM slr-base:bookworm`. It holds python3, git, bash,
    ca-certificates, procps, curl and coreutils. Needs root and debootstrap; honours
    DOCKER_HOST like every docker client.
    """
    from slr_backend_docker.client import connect

    client = connect()
    if build_base_image(client, tag=tag, mirror=mirror, force=force):
        click.echo(f"built {tag}")
    else:
        click.echo(f"{tag} already exists (use --force to rebuild)")
