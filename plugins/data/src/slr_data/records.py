"""SWE dataset records, read into one shape: ``Instance``.

Each published dataset names its fields its own way; ``read_records`` maps a JSONL file of one
format onto ``Instance`` and says which record and field is wrong when one is. The field names
come from each dataset's card (cited in docs/data.md):

- ``swe-bench`` / ``swe-gym`` / ``swe-rebench``: ``instance_id``, ``repo``, ``base_commit``,
  ``patch`` (the gold patch), ``test_patch``, ``problem_statement``, ``hints_text``,
  ``created_at``, ``version``, ``FAIL_TO_PASS``, ``PASS_TO_PASS`` (SWE-bench stores the two
  lists as JSON-encoded strings, SWE-Gym and SWE-rebench as lists);
  SWE-rebench adds a prebuilt ``docker_image`` (older dumps: ``image_name``).
- ``swe-smith``: ``instance_id``, ``repo``, ``patch`` (the change that *introduces* the bug),
  ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``image_name``, ``problem_statement``; no test patch
  (the repository's own tests catch the bug).
- ``r2e-gym``: ``repo_name``, ``docker_image``, ``commit_hash``, ``problem_statement``,
  ``parsed_commit_content`` (JSON: the commit's ``file_diffs``, each with the file's
  ``header.file.path`` and ``new_file_content``), ``expected_output_json`` (JSON: test name to
  ``PASSED`` / ``FAILED``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attrs import field, frozen

from slr.errors import UsageError

FORMATS = ("swe-bench", "swe-gym", "swe-smith", "r2e-gym", "swe-rebench")


@frozen(kw_only=True)
class Instance:
    """One task to build, whatever it came from."""

    instance_id: str
    repo: str
    """``owner/name`` (or a local repository path, for tests and private mirrors)."""
    problem_statement: str
    base_commit: str | None = None
    gold_patch: str = ""
    """Applied by the oracle (``git apply``)."""
    test_patch: str = ""
    """Hidden from the agent; applied by the verifier before the tests run."""
    bug_patch: str = ""
    """Applied while the image is built (SWE-smith's bug), before the history is squashed."""
    solution_files: dict[str, str] = field(factory=dict)
    """Whole files the oracle writes (R2E-Gym gives contents, not a patch)."""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    image: str | None = None
    """A prebuilt image holding the repository at the base commit, when the record names one."""
    workdir: str = "/testbed"
    source: str = ""
    created_at: str = ""
    hints: str = ""
    metadata: dict[str, Any] = field(factory=dict)

    @property
    def task_id(self) -> str:
        return task_id_of(self.instance_id)


def task_id_of(instance_id: str) -> str:
    """A folder-safe task id (Harbor task ids are folder names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", instance_id).strip("-.") or "task"


class RecordError(UsageError):
    def __init__(self, file: Path, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")


def _tests(value: Any, name: str) -> tuple[str, ...]:
    """A FAIL_TO_PASS / PASS_TO_PASS value: a list, or a JSON-encoded list (SWE-bench)."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            raise ValueError(f"{name} is a string but not a JSON list: {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of test ids, got {type(value).__name__}")
    return tuple(value)


def _need(rec: dict[str, Any], key: str) -> Any:
    if rec.get(key) in (None, ""):
        raise ValueError(f"field {key!r} is missing or empty")
    return rec[key]


def _swe_bench(rec: dict[str, Any], source: str) -> Instance:
    image = rec.get("docker_image") or rec.get("image_name") or None
    return Instance(
        instance_id=str(_need(rec, "instance_id")),
        repo=str(_need(rec, "repo")),
        base_commit=str(_need(rec, "base_commit")),
        problem_statement=str(_need(rec, "problem_statement")),
        gold_patch=str(_need(rec, "patch")),
        test_patch=str(rec.get("test_patch") or ""),
        fail_to_pass=_tests(rec.get("FAIL_TO_PASS"), "FAIL_TO_PASS"),
        pass_to_pass=_tests(rec.get("PASS_TO_PASS"), "PASS_TO_PASS"),
        image=image,
        source=source,
        created_at=str(rec.get("created_at") or ""),
        hints=str(rec.get("hints_text") or ""),
        metadata={k: rec[k] for k in ("version", "environment_setup_commit") if rec.get(k)},
    )


def _swe_smith(rec: dict[str, Any], source: str) -> Instance:
    return Instance(
        instance_id=str(_need(rec, "instance_id")),
        repo=str(_need(rec, "repo")),
        base_commit=rec.get("base_commit") or None,
        problem_statement=str(_need(rec, "problem_statement")),
        bug_patch=str(_need(rec, "patch")),
        fail_to_pass=_tests(rec.get("FAIL_TO_PASS"), "FAIL_TO_PASS"),
        pass_to_pass=_tests(rec.get("PASS_TO_PASS"), "PASS_TO_PASS"),
        image=str(_need(rec, "image_name")),
        source=source,
        created_at=str(rec.get("created_at") or ""),
    )


def _r2e_gym(rec: dict[str, Any], source: str) -> Instance:
    commit = str(_need(rec, "commit_hash"))
    repo = str(_need(rec, "repo_name"))
    content = rec.get("parsed_commit_content") or "{}"
    parsed = json.loads(content) if isinstance(content, str) else content
    files: dict[str, str] = {}
    for diff in parsed.get("file_diffs") or []:
        path = ((diff.get("header") or {}).get("file") or {}).get("path")
        new = diff.get("new_file_content")
        if path and new is not None and not is_test_path(path):
            files[path] = new
    expected = rec.get("expected_output_json") or "{}"
    outcome = json.loads(expected) if isinstance(expected, str) else expected
    passing = tuple(sorted(t for t, s in outcome.items() if str(s).upper() == "PASSED"))
    return Instance(
        instance_id=f"{repo}-{commit[:12]}",
        repo=repo,
        base_commit=commit,
        problem_statement=str(_need(rec, "problem_statement")),
        solution_files=files,
        # R2E-Gym grades on the whole expected outcome; which of the passing tests fail
        # before the fix is not in the record, so they all count as must-pass.
        fail_to_pass=passing,
        image=str(_need(rec, "docker_image")),
        source=source,
    )


_READERS: dict[str, Callable[[dict[str, Any], str], Instance]] = {
    "swe-bench": _swe_bench,
    "swe-gym": _swe_bench,
    "swe-rebench": _swe_bench,
    "swe-smith": _swe_smith,
    "r2e-gym": _r2e_gym,
}


def read_records(path: Path, fmt: str) -> Iterator[Instance]:
    """The instances of a JSONL file in dataset format ``fmt``."""
    if fmt not in _READERS:
        raise UsageError(f"--format {fmt!r} is not known; use one of {', '.join(FORMATS)}")
    reader = _READERS[fmt]
    with Path(path).open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(path, n, f"not a JSON object ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise RecordError(path, n, "not a JSON object")
            try:
                yield reader(rec, fmt)
            except (ValueError, TypeError, AttributeError) as exc:
                raise RecordError(
                    path, n, f"not a {fmt} record: {exc} (is --format right?)"
                ) from None


_TEST_PART = re.compile(r"(^|/)(tests?|testing)(/|$)")
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")


def is_test_path(path: str) -> bool:
    """Whether a repository path is test code (a tests/ folder, test_*.py, conftest.py)."""
    return bool(_TEST_PART.search(path) or _TEST_FILE.search(path))
