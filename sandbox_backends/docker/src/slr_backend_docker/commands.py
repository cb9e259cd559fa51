"""``slr images``: build, push and prune the docker backend's task images, and its base image."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from slr_backend_docker.base_image import BASE_TAG, MIRROR, build_base_image

_docker_url = click.option(
    "--docker-url",
    default=None,
    help="Docker daemon URL; default: DOCKER_HOST or the local socket.",
)
_as_json = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


@click.group()
def images() -> None:
    """Build, push, prune and inspect sandbox images (docker backend)."""


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


def _load(paths: tuple[Path, ...]) -> list[Any]:
    from slr.tasks import load_tasks

    return [t for p in paths for t in load_tasks(p)]


def _from_config(config_path: Path | None, paths: tuple[Path, ...]) -> tuple[Any, list[Any]]:
    """The image settings of a run config's backend, and the tasks to build."""
    from slr.plugins import get_plugin_manager
    from slr.tasks import load_tasks
    from slr_backend_docker.config import DockerBackendConfig

    if config_path is None:
        if not paths:
            raise click.UsageError("name the task sets to build (PATHS), or a run config (-c)")
        return DockerBackendConfig(), _load(paths)
    from slr.config import load_config

    config = load_config(config_path, plugins=get_plugin_manager(), only_plugins=("backend",))
    options, name = config.backend.options, config.backend.name
    if name == "docker":
        cfg = options
    elif name == "k8s":  # its builder is the docker backend's; its registry is where pods pull
        registry = options.registry if options.image_load == "registry" else ""
        cfg = DockerBackendConfig(base_url=options.docker_url, registry=registry)
    else:
        raise click.UsageError(
            f"{config_path}: [backend] name = {name!r} builds no images; slr images builds "
            f"for the docker and k8s backends"
        )
    if paths:
        return cfg, _load(paths)
    t = config.tasks
    return cfg, load_tasks(t.path, include=t.include, split=t.split)


@images.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A run config: its [tasks] (when no PATHS) and its [backend] (docker: base_url, "
    "image_prefix, registry; k8s: docker_url, and registry with image_load = 'registry').",
)
@click.option("-j", "--jobs", default=4, show_default=True, help="Images built at once.")
@click.option(
    "--logs",
    "log_dir",
    default=Path("image-build-logs"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the build log of each failed task (<task>.log).",
)
@click.option(
    "--push",
    default=None,
    metavar="REGISTRY",
    help="Push every task image to this registry prefix (host:port/path) after building; "
    "the k8s backend pulls <REGISTRY>/<tag> with image_load = 'registry'. Default: the "
    "config's backend registry, if any.",
)
@click.option("--prefix", default=None, help="Image name prefix [default: slr-task].")
@_docker_url
@_as_json
def build(paths, config_path, jobs, log_dir, push, prefix, docker_url, as_json) -> None:
    """Build every task's image once, JOBS at a time (a built tag is never rebuilt).

    \b
    PATHS are task folders, task sets or parquet indexes (or -c: the run's [tasks]). Each
    image is tagged with its task's environment content hash, as a run's sandboxes look it
    up: `built` ran the Dockerfile, `cached` found the tag, `pulled` came from the docker
    backend's registry, `failed` wrote the build log into --logs. Exits 1 when any build
    failed.
    """
    from slr_backend_docker.backend import DockerBackend
    from slr_backend_docker.builds import summary
    from slr_backend_docker.config import DockerBackendConfig, check_registry

    if jobs < 1:
        raise click.BadParameter(f"must be at least 1, not {jobs}", param_hint="--jobs")
    try:
        check_registry(push or "", "--push")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--push") from None
    cfg, tasks = _from_config(config_path, paths)
    cfg = DockerBackendConfig(
        base_url=docker_url or cfg.base_url,
        image_prefix=prefix or cfg.image_prefix,
        registry=cfg.registry,
    )
    push = cfg.registry if push is None else push
    backend = DockerBackend(cfg, sandboxes=jobs)
    backend.client  # noqa: B018 (connects: a daemon that does not answer fails here, once)
    results = asyncio.run(_build_with_progress(backend, tasks, jobs, log_dir, push, as_json))
    counts = summary(results)
    failed = [r for r in results if r.status == "failed"]
    if as_json:
        click.echo(
            json.dumps(
                {
                    **counts,
                    "tasks": len(results),
                    "logs": str(log_dir) if failed else "",
                    "pushed_to": push,
                    "images": [r.as_json() for r in results],
                },
                indent=1,
            )
        )
    else:
        _print_builds(results, counts, log_dir if failed else None, push)
    if failed:
        raise SystemExit(1)


async def _build_with_progress(backend, tasks, jobs, log_dir, push, quiet) -> list[Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slr_backend_docker.builds import build_images

    running: set[str] = set()
    progress = Progress(
        TextColumn("images"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=Console(stderr=True),
        disable=quiet,
    )
    bar = progress.add_task("", total=len(tasks))

    def started(task: Any) -> None:
        running.add(task.id)
        progress.update(bar, description=_now_building(running))

    def done(result: Any) -> None:
        running.discard(result.task_id)
        progress.update(bar, advance=1, description=_now_building(running))

    try:
        with progress:
            return await build_images(
                backend,
                tasks,
                jobs=jobs,
                log_dir=log_dir,
                push=push,
                on_start=started,
                on_done=done,
            )
    finally:
        await backend.close()


def _now_building(running: set[str]) -> str:
    names = sorted(running)
    more = f" +{len(names) - 2}" if len(names) > 2 else ""
    return ("building " + ", ".join(names[:2]) + more) if names else ""


def _print_builds(results, counts, log_dir, push) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("task", "image", "status", "seconds", "note", title="task images")
    for r in results:
        note = r.error[:120] if r.status == "failed" else (f"pushed {r.pushed}" if r.pushed else "")
        table.add_row(r.task_id, r.tag, r.status, f"{r.seconds:.1f}", note)
    Console().print(table)
    line = ", ".join(f"{k} {n}" for k, n in counts.items() if n or k != "pulled")
    if log_dir is not None:
        line += f"; build logs of the failures in {log_dir}/"
    if push:
        line += f"; pushed to {push}"
    click.echo(line)


@images.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(min=0),
    default=None,
    metavar="DAYS",
    help="Only images made more than DAYS days ago (alone: every such task image).",
)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option(
    "--prefix",
    default="slr-task",
    show_default=True,
    help="The image name prefix the images were built under (the backend's image_prefix).",
)
@_docker_url
@_as_json
def prune(paths, older_than, dry_run, prefix, docker_url, as_json) -> None:
    """Remove task images slr built that the task sets in PATHS do not use.

    \b
    Only images labelled slr.image=task (every task image slr builds has it) and tagged
    with exactly the name slr gave them are considered: the base image, a task's prebuilt
    docker_image and any image of your own (even one built FROM a task image) are never
    touched, nor is an image a container still uses. With --older-than, only those older.
    """
    from slr_backend_docker import prune as pruning
    from slr_backend_docker.client import connect

    if not paths and older_than is None:
        raise click.UsageError(
            "name the task sets whose images to keep (slr images prune TASKS...), or give "
            "--older-than DAYS, or both"
        )
    keep = [(t.id, t.environment.content_hash) for t in _load(paths)] if paths else None
    client = connect(docker_url)
    items, kept = pruning.plan(client, keep=keep, older_than_days=older_than, prefix=prefix)
    if not dry_run:
        items = pruning.remove(client, items)
    removed = [i for i in items if i.outcome in ("removed", "would remove")]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "kept": kept,
                    "removed": 0 if dry_run else len(removed),
                    "would_remove": len(removed) if dry_run else 0,
                    "not_removed": len(items) - len(removed),
                    "images": [i.as_json() for i in items],
                },
                indent=1,
            )
        )
        return
    for i in items:
        click.echo(f"{i.outcome}: {', '.join(i.tags) or i.image_id[:19]} ({i.reason})")
    verb = "would remove" if dry_run else "removed"
    # no byte count: an image's size includes the base layers it shares with the others
    click.echo(
        f"{verb} {len(removed)} task images, kept {kept}"
        + (f", {len(items) - len(removed)} still in use" if len(items) > len(removed) else "")
    )
