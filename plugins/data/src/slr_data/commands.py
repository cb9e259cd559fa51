"""``slr data``: import, mine, synth, validate, filter, index, stats (click)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slr_data.harbor import DEFAULT_BASE_IMAGE
from slr_data.records import FORMATS

__all__ = ["data"]


@click.group()
def data() -> None:
    """Build task sets: import SWE datasets, mine or synthesise tasks, validate, filter, index.

    \b
      slr data import swe-gym.jsonl --format swe-gym --repos clones/ -o tasks/
      slr data mine path/to/repo -o tasks/        tasks from commits that fix tests
      slr data synth path/to/repo -o tasks/       SWE-smith-style bugs the tests catch
      slr data validate tasks/ -n 3               oracle 1, nop 0, three times each
      slr data index tasks/ -o tasks.parquet      splits by repository, difficulty, digest
      slr data stats tasks.parquet
    """


def _backend(name: str, opts: tuple[str, ...]):
    from slr.plugins import make_plugin

    return make_plugin("sandbox_backend", name, opts)


_base_image = click.option(
    "--base-image",
    default=DEFAULT_BASE_IMAGE,
    show_default=True,
    help="Image the repository is copied onto (needs python3 and git).",
)
_backend_opt = click.option(
    "--backend", default="docker", show_default=True, help="Sandbox backend that runs the tests."
)
_pytest_opt = click.option(
    "--pytest/--no-pytest",
    "add_pytest",
    default=True,
    show_default=True,
    help="Copy this machine's pytest into images built from --base-image (offline builds).",
)


@data.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Dataset format.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option(
    "--repos",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Folder of local clones (<owner>__<name>): images build without network.",
)
@click.option("--offline", is_flag=True, help="Fail on records with no image and no local clone.")
@click.option("--limit", type=int, help="Import only the first N records.")
@click.option("--python", default="python3", show_default=True, help="Python that runs the tests.")
@_base_image
@_pytest_opt
def import_(file, fmt, output, repos, offline, limit, python, base_image, add_pytest) -> None:
    """One Harbor task per record of a SWE-bench-style JSONL FILE."""
    from slr_data.importer import import_file

    written = import_file(
        file,
        fmt,
        output,
        limit=limit,
        repos=repos,
        base_image=base_image,
        add_pytest=add_pytest,
        python=python,
        require_local=offline,
    )
    click.echo(f"wrote {len(written)} tasks under {output}")


def _report(results, title: str, as_json: bool) -> None:
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "task": str(r.task) if r.task else None,
                        "reason": r.reason,
                        "seconds": round(r.seconds, 2),
                        "fail_to_pass": r.fail_to_pass,
                        "pass_to_pass": r.pass_to_pass,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
        return
    table = Table("candidate", "kept", "F2P", "P2P", "s", "reason", title=title)
    for r in results:
        table.add_row(
            r.name,
            "yes" if r.task else "no",
            str(r.fail_to_pass),
            str(r.pass_to_pass),
            f"{r.seconds:.1f}",
            r.reason,
        )
    Console().print(table)


def _progress(outcome: Any) -> None:
    click.echo(f"  {outcome.name}: {'kept' if outcome.task else outcome.reason}", err=True)


def _on_backend(name: str, work: Any, label: str, as_json: bool) -> None:
    """Run ``work(backend)`` on the named backend, close it on every path, report the result."""
    be = _backend(name, ())

    async def go() -> Any:
        try:
            return await work(be)
        finally:
            await be.close()

    _report(asyncio.run(go()), label, as_json)


@data.command()
@click.argument("repo", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--rev", default="HEAD", show_default=True, help="Walk history back from here.")
@click.option("--max-commits", default=200, show_default=True, help="Commits to look at.")
@click.option("--max-tasks", type=int, help="Stop after this many tasks.")
@click.option("--name", help="Repository name in task ids (default: the folder name).")
@_base_image
@_pytest_opt
@_backend_opt
@click.option("--json", "as_json", is_flag=True)
def mine(repo, output, rev, max_commits, max_tasks, name, base_image, add_pytest, backend, as_json):
    """Tasks from REPO's commits that change source and tests (tests really run)."""
    from slr_data.mine import mine as run

    _on_backend(
        backend,
        lambda be: run(
            repo,
            output,
            be,
            name=name,
            rev=rev,
            max_commits=max_commits,
            max_tasks=max_tasks,
            base_image=base_image,
            add_pytest=add_pytest,
            progress=_progress,
        ),
        f"mined {repo}",
        as_json,
    )


@data.command()
@click.argument("repo", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--rev", default="HEAD", show_default=True)
@click.option("-n", "--max-tasks", default=20, show_default=True, help="Tasks to make.")
@click.option("--max-tries", default=200, show_default=True, help="Mutations to try at most.")
@click.option("--seed", default=0, show_default=True)
@click.option("--name", help="Repository name in task ids (default: the folder name).")
@_base_image
@_pytest_opt
@_backend_opt
@click.option("--json", "as_json", is_flag=True)
def synth(
    repo, output, rev, max_tasks, max_tries, seed, name, base_image, add_pytest, backend, as_json
):
    """SWE-smith-style tasks: mutate REPO's functions, keep what its tests catch."""
    from slr_data.synth import synth as run

    _on_backend(
        backend,
        lambda be: run(
            repo,
            output,
            be,
            name=name,
            rev=rev,
            max_tasks=max_tasks,
            max_tries=max_tries,
            seed=seed,
            base_image=base_image,
            add_pytest=add_pytest,
            progress=_progress,
        ),
        f"synthesised from {repo}",
        as_json,
    )


from slr_data.curate_cmds import filter_, index, stats, validate  # noqa: E402

data.add_command(validate)
data.add_command(filter_)
data.add_command(index)
data.add_command(stats)
