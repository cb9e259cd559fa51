"""``slr data import``: dataset records to Harbor task folders."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from slr.errors import UsageError
from slr_data.harbor import DEFAULT_BASE_IMAGE, write_task
from slr_data.records import Instance, read_records


def find_repo(inst: Instance, repos: Path | None) -> Path | None:
    """A local clone of the instance's repository, if there is one.

    The record's ``repo`` may itself be a local path (private mirrors, tests); otherwise
    ``repos/<owner>__<name>``, ``repos/<owner>/<name>`` or ``repos/<name>``.
    """
    direct = Path(inst.repo).expanduser()
    if direct.is_absolute() and (direct / ".git").exists():
        return direct
    if repos is None:
        return None
    owner, _, name = inst.repo.rpartition("/")
    for cand in (repos / f"{owner}__{name}", repos / inst.repo, repos / name):
        if (cand / ".git").exists() or (cand / "HEAD").is_file():
            return cand
    return None


def import_instances(
    instances: Iterable[Instance],
    out: Path,
    *,
    repos: Path | None = None,
    base_image: str = DEFAULT_BASE_IMAGE,
    add_pytest: bool = False,
    python: str = "python3",
    require_local: bool = False,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for inst in instances:
        repo_dir = None if inst.image else find_repo(inst, repos)
        if repo_dir is None and not inst.image and require_local:
            raise UsageError(
                f"{inst.instance_id}: no local clone of {inst.repo} under "
                f"{repos or '(no --repos)'} and the record names no image; clone it there "
                f"(as <owner>__<name>) or drop --offline to build from GitHub"
            )
        written.append(
            write_task(
                inst,
                out,
                repo_dir=repo_dir,
                base_image=base_image,
                add_pytest=add_pytest,
                python=python,
            )
        )
    return written


def import_file(path: Path, fmt: str, out: Path, *, limit: int | None = None, **kw) -> list[Path]:
    records = read_records(path, fmt)
    chosen = [r for i, r in enumerate(records) if limit is None or i < limit]
    return import_instances(chosen, out, **kw)
