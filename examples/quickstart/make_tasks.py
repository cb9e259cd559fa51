"""Write the quickstart's Harbor tasks: six file-system skills, many variants of each.

    python examples/quickstart/make_tasks.py [OUTPUT]      (default: tasks/ next to this file)

Train and held-out tasks are the same skills with different file names and words, so the
held-out pass rate measures whether the policy learned the skill, not the strings. The
tasks are committed; re-run this after editing it (it rewrites tasks/ whole).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
TASKS = HERE / "tasks"

TASK_TOML = """\
version = "1.0"

[task]
name = "slr-quickstart/{id}"
description = "{description}"

[metadata]
difficulty = "easy"
category = "file-operations"
tags = ["quickstart", "{skill}"]

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 60.0
cpus = 1
memory_mb = 512
storage_mb = 256
allow_internet = false
"""

TEST_HEAD = """\
#!/bin/bash
# Reward 1 when {description}
mkdir -p /logs/verifier
if {condition}; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "not done: $(ls -la /app 2>&1 | head -20)"
  echo 0 > /logs/verifier/reward.txt
fi
"""


def skill_write(a: str, w: str) -> dict:
    return {
        "instruction": f"Create a file named `{a}.txt` containing the word `{w}`.",
        "description": f"/app/{a}.txt holds exactly the word {w}.",
        "condition": f'[ -f /app/{a}.txt ] && [ "$(cat /app/{a}.txt)" = "{w}" ]',
        "solution": f"echo {w} > /app/{a}.txt",
        "files": {},
    }


def skill_mkdir(a: str, w: str) -> dict:
    return {
        "instruction": f"Create a directory named `{a}`.",
        "description": f"/app/{a} is a directory.",
        "condition": f"[ -d /app/{a} ] && [ ! -L /app/{a} ]",
        "solution": f"mkdir /app/{a}",
        "files": {},
    }


def skill_delete(a: str, w: str) -> dict:
    return {
        "instruction": f"Delete the file `{a}.txt`.",
        "description": f"/app/{a}.txt is gone and /app/keep.txt is still there.",
        "condition": f"[ ! -e /app/{a}.txt ] && [ -f /app/keep.txt ]",
        "solution": f"rm /app/{a}.txt",
        "files": {f"{a}.txt": f"{w}\n", "keep.txt": "keep\n"},
    }


def skill_rename(a: str, w: str) -> dict:
    b = f"{w}"
    return {
        "instruction": f"Rename the file `{a}.txt` to `{b}.txt`.",
        "description": f"/app/{a}.txt was renamed to /app/{b}.txt (content kept).",
        "condition": f'[ ! -e /app/{a}.txt ] && [ "$(cat /app/{b}.txt 2>/dev/null)" = "{a}" ]',
        "solution": f"mv /app/{a}.txt /app/{b}.txt",
        "files": {f"{a}.txt": f"{a}\n"},
    }


def skill_copy(a: str, w: str) -> dict:
    b = f"{w}"
    return {
        "instruction": f"Copy the file `{a}.txt` to `{b}.txt`.",
        "description": f"/app/{b}.txt is a copy of /app/{a}.txt, which is still there.",
        "condition": f'[ "$(cat /app/{a}.txt)" = "{a}" ] && [ "$(cat /app/{b}.txt 2>/dev/null)" = "{a}" ]',
        "solution": f"cp /app/{a}.txt /app/{b}.txt",
        "files": {f"{a}.txt": f"{a}\n"},
    }


def skill_append(a: str, w: str) -> dict:
    return {
        "instruction": f"Add the line `{w}` at the end of the file `{a}.txt`.",
        "description": f"/app/{a}.txt has its first line kept and {w} as its last line.",
        "condition": f'[ "$(head -n1 /app/{a}.txt)" = "first" ] && [ "$(tail -n1 /app/{a}.txt)" = "{w}" ]',
        "solution": f"echo {w} >> /app/{a}.txt",
        "files": {f"{a}.txt": "first\n"},
    }


SKILLS = {
    "write": skill_write,
    "mkdir": skill_mkdir,
    "delete": skill_delete,
    "rename": skill_rename,
    "copy": skill_copy,
    "append": skill_append,
}

# (name, word) pairs; the held-out ones appear in no training task.
TRAIN = [("apple", "red"), ("notes", "blue"), ("data", "green"), ("report", "sun"),
         ("todo", "moon"), ("log", "tree")]  # fmt: skip
HELDOUT = [("music", "star"), ("plan", "rain"), ("list", "fish")]  # fmt: skip


def write_task(root: Path, skill: str, a: str, w: str) -> None:
    spec = SKILLS[skill](a, w)
    # The command is in the instruction: what SmolLM2-135M can learn in minutes on a CPU is
    # to turn it into one clean action (its base rate is ~0.1-0.2, see README.md).
    spec["instruction"] += f" Use the command `{spec['solution'].replace('/app/', '')}`."
    tid = f"{skill}-{a}-{w}"
    d = root / tid
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "task.toml").write_text(
        TASK_TOML.format(id=tid, description=spec["description"], skill=skill)
    )
    (d / "instruction.md").write_text(spec["instruction"] + "\n")
    lines = ["FROM slr-base:bookworm", "WORKDIR /app"]
    for name, text in spec["files"].items():
        (d / "environment" / name).write_text(text)
        lines.append(f"COPY {name} /app/{name}")
    (d / "environment" / "Dockerfile").write_text("\n".join(lines) + "\n")
    test = d / "tests" / "test.sh"
    test.write_text(TEST_HEAD.format(description=spec["description"], condition=spec["condition"]))
    solve = d / "solution" / "solve.sh"
    solve.write_text(f"#!/bin/bash\nset -euo pipefail\n{spec['solution']}\n")
    test.chmod(0o755)
    solve.chmod(0o755)


def main(out: Path = TASKS) -> None:
    shutil.rmtree(out, ignore_errors=True)
    for split, pairs in (("train", TRAIN), ("heldout", HELDOUT)):
        for skill in SKILLS:
            for a, w in pairs:
                write_task(out / split, skill, a, w)
    n = {s: len(list((out / s).iterdir())) for s in ("train", "heldout")}
    print(f"wrote {n['train']} train and {n['heldout']} held-out tasks under {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else TASKS)
