"""Write one ``Instance`` as a Harbor task folder.

::

    <task>/task.toml            [metadata] source, repo, base commit, test counts
    <task>/instruction.md       the problem statement
    <task>/environment/         Dockerfile + what it copies in (no network needed when the
                                repository is on this machine or the record names an image)
    <task>/tests/               test.sh -> run_tests.py; config.json (FAIL_TO_PASS,
                                PASS_TO_PASS, test files); test.patch (hidden tests)
    <task>/solution/            solve.sh + gold.patch (or whole files)

The image holds the repository at the base commit as a single commit (``prepare.sh``): no
later commit, and not even the earlier history, is in the image, so an agent cannot read
the fix out of git. The verifier phase gets the image's history back
(``restore_git_history``), resets the graded test files to it and applies the hidden tests.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from slr.errors import UsageError
from slr_data.records import Instance, is_test_path

DEFAULT_BASE_IMAGE = "slr-base:bookworm"
# Pure-Python test tools copied from this machine into images that lack pytest (offline).
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
IMAGE_SITE = "/usr/lib/python3/dist-packages"

PREPARE_SH = """\
#!/bin/sh
# Leave the repository at the base commit as one commit: nothing later, nothing earlier.
set -eu
cd "$1"
if [ -s /tmp/slr/bug.patch ]; then git apply --whitespace=nowarn /tmp/slr/bug.patch; fi
rm -rf .git
git init -q -b main
git add -A
export GIT_AUTHOR_NAME=slr GIT_AUTHOR_EMAIL=slr@localhost
export GIT_COMMITTER_NAME=slr GIT_COMMITTER_EMAIL=slr@localhost
export GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z
git -c core.hooksPath=/dev/null commit -q --allow-empty -m "base"
"""

TEST_SH = """\
#!/bin/bash
# Reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes (tests/config.json).
mkdir -p /logs/verifier
echo '{{"reward": 0.0}}' > /logs/verifier/reward.json
{python} /tests/run_tests.py --config /tests/config.json --reward /logs/verifier/reward.json
"""

SOLVE_PATCH_SH = """\
#!/bin/bash
set -euo pipefail
cd {workdir}
git -c safe.directory='*' apply --whitespace=nowarn /solution/gold.patch
"""

SOLVE_FILES_SH = """\
#!/bin/bash
set -euo pipefail
cd {workdir}
cp -a /solution/files/. .
"""


def git(repo: Path, *args: str, text: bool = True) -> str:
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(repo), *args],
        capture_output=True,
        text=text,
    )
    if proc.returncode != 0:
        raise UsageError(f"git {' '.join(args[:3])} in {repo} failed: {proc.stderr.strip()}")
    return proc.stdout


def snapshot(repo: Path, commit: str, dest: Path) -> None:
    """The tracked files of ``repo`` at ``commit`` into ``dest`` (no .git)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as fh:
        proc = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(repo), "archive", "--format=tar", commit],
            stdout=fh,
            stderr=subprocess.PIPE,
        )
        if proc.returncode != 0:
            raise UsageError(
                f"{repo}: cannot read commit {commit!r}: {proc.stderr.decode().strip()}"
            )
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(dest, filter="tar")


def pytest_tools(dest: Path) -> None:
    """Copy this machine's pytest (pure Python) into ``dest`` for an offline image build."""
    for name in PYTEST_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(
                origin.parent,
                dest / origin.parent.name,
                ignore=shutil.ignore_patterns("__pycache__"),
                dirs_exist_ok=True,
            )
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, dest / origin.name)


def patch_files(patch: str) -> list[str]:
    """The paths a unified diff touches (``b/`` side; ``a/`` side for deletions)."""
    out: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            parts = line.split()
            if len(parts) >= 4:
                path = parts[3][2:] if parts[3].startswith("b/") else parts[3]
                if path not in out:
                    out.append(path)
    return out


def write_task(
    inst: Instance,
    out: Path,
    *,
    repo_dir: Path | None = None,
    base_image: str = DEFAULT_BASE_IMAGE,
    add_pytest: bool = False,
    python: str = "python3",
    timeout_s: float = 600.0,
    extra_metadata: dict | None = None,
) -> Path:
    """Write ``inst`` as a task folder ``out/<task id>``; returns the folder."""
    task = out / inst.task_id
    if task.exists():
        shutil.rmtree(task)
    env = task / "environment"
    (env / "slr").mkdir(parents=True)
    workdir = inst.workdir
    (env / "slr" / "prepare.sh").write_text(PREPARE_SH)
    (env / "slr" / "bug.patch").write_text(inst.bug_patch)
    lines: list[str] = []
    if inst.image:
        lines.append(f"FROM {inst.image}")
    else:
        lines.append(f"FROM {base_image}")
    if add_pytest:
        pytest_tools(env / "pytools")
        # first, so every task built from the same base shares this layer
        lines.append(f"COPY pytools/ {IMAGE_SITE}/")
    if inst.image:
        pass  # the image holds the repository at the base commit already
    elif repo_dir is not None:
        if not inst.base_commit:
            raise UsageError(f"{inst.instance_id}: no base_commit to build the repository at")
        snapshot(repo_dir, inst.base_commit, env / "repo")
        lines.append(f"COPY repo/ {workdir}/")
    else:
        if not inst.base_commit:
            raise UsageError(f"{inst.instance_id}: no base_commit and no image to build from")
        # A build recipe: needs network while the image is built (never in a trial).
        lines.append(
            f"RUN git clone -q https://github.com/{inst.repo}.git {workdir} && "
            f"git -C {workdir} checkout -q {inst.base_commit}"
        )
    lines += [
        f"WORKDIR {workdir}",
        "COPY slr/ /tmp/slr/",
        f"RUN sh /tmp/slr/prepare.sh {workdir} && rm -rf /tmp/slr",
    ]
    (env / "Dockerfile").write_text("\n".join(lines) + "\n")

    tests = task / "tests"
    tests.mkdir()
    (tests / "test.patch").write_text(inst.test_patch)
    graded = [*inst.fail_to_pass, *inst.pass_to_pass]
    test_files = sorted(
        set(patch_files(inst.test_patch)) | {t.split("::", 1)[0] for t in graded if "::" in t}
    )
    config = {
        "workdir": workdir,
        "fail_to_pass": list(inst.fail_to_pass),
        "pass_to_pass": list(inst.pass_to_pass),
        "test_files": test_files,
        "python": python,
        "timeout_s": timeout_s,
    }
    (tests / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    runner = Path(__file__).with_name("run_tests.py")
    shutil.copy2(runner, tests / "run_tests.py")
    (tests / "test.sh").write_text(TEST_SH.format(python=python))
    (tests / "test.sh").chmod(0o755)

    sol = task / "solution"
    sol.mkdir()
    if inst.solution_files:
        for rel, text in inst.solution_files.items():
            p = sol / "files" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        (sol / "solve.sh").write_text(SOLVE_FILES_SH.format(workdir=workdir))
    elif inst.bug_patch and not inst.gold_patch:
        (sol / "gold.patch").write_text(inst.bug_patch)
        (sol / "solve.sh").write_text(
            SOLVE_PATCH_SH.format(workdir=workdir).replace("apply ", "apply -R ")
        )
    else:
        (sol / "gold.patch").write_text(inst.gold_patch)
        (sol / "solve.sh").write_text(SOLVE_PATCH_SH.format(workdir=workdir))
    (sol / "solve.sh").chmod(0o755)

    (task / "instruction.md").write_text(instruction(inst))
    (task / "task.toml").write_text(task_toml(inst, timeout_s, extra_metadata or {}))
    return task


def instruction(inst: Instance) -> str:
    return (
        f"{inst.problem_statement.strip()}\n\n---\n\nThe repository is in `{inst.workdir}`. "
        "Change the source code so the problem above is resolved; the repository's tests "
        "are run to check your work, so do not edit them.\n"
    )


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def task_toml(inst: Instance, timeout_s: float, extra: dict) -> str:
    meta = {
        "source": inst.source,
        "repo": inst.repo,
        "instance_id": inst.instance_id,
        "base_commit": inst.base_commit or "",
        "image": inst.image or "",
        "created_at": inst.created_at,
        "fail_to_pass": len(inst.fail_to_pass),
        "pass_to_pass": len(inst.pass_to_pass),
        "source_files": len(
            [p for p in patch_files(inst.gold_patch or inst.bug_patch) if not is_test_path(p)]
            or inst.solution_files
        ),
        **extra,
    }
    rows = []
    for key, value in meta.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            value = _toml_str(str(value))
        rows.append(f"{key} = {value}")
    return (
        'version = "1.0"\n\n[task]\n'
        f"name = {_toml_str('slr-data/' + inst.task_id)}\n\n"
        "[metadata]\n" + "\n".join(rows) + "\n\n"
        f"[verifier]\ntimeout_sec = {float(timeout_s)}\n\n"
        "[agent]\ntimeout_sec = 1800.0\n\n"
        f'[environment]\nbuild_timeout_sec = 1800.0\nallow_internet = false\nworkdir = "{inst.workdir}"\n\n'
        "# The image holds one commit; the verifier resets the graded tests to it.\n"
        "[slr]\nsquash_git_history = true\nrestore_git_history = true\n"
    )
