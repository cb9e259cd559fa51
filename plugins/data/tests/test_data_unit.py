"""slr-data without docker: dataset records, task folders, mutations, indexes."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from slr_data.commands import data
from slr_data.harbor import patch_files, write_task
from slr_data.records import FORMATS, read_records
from slr_data.synth import mutations

from slr.errors import UsageError
from slr.tasks import load_task

DIFF = "diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1 +1 @@\n-x\n+y\n"
TEST_DIFF = DIFF.replace("calc/ops.py", "tests/test_ops.py")


def records(repo: str, base: str) -> dict[str, dict]:
    """One record per format, shaped like each dataset card's schema."""
    swe_bench = {
        "repo": repo,
        "instance_id": "calc__calc-1",
        "base_commit": base,
        "patch": DIFF,
        "test_patch": TEST_DIFF,
        "problem_statement": "clamp is wrong",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "1.0",
        # SWE-bench stores the lists as JSON strings
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_clamp_edges"]),
        "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_add"]),
        "environment_setup_commit": base,
    }
    swe_gym = {
        **swe_bench,
        "FAIL_TO_PASS": ["tests/test_ops.py::test_clamp_edges"],
        "PASS_TO_PASS": ["tests/test_ops.py::test_add"],
    }
    swe_gym.pop("environment_setup_commit")
    swe_rebench = {
        **swe_gym,
        "environment_setup_commit": base,
        "docker_image": "img:1",
        "meta": {"has_test_patch": True},
    }
    swe_smith = {
        "instance_id": "calc.abc__func_pm_op_swap__1",
        "patch": DIFF,
        "FAIL_TO_PASS": ["tests/test_ops.py::test_clamp_edges"],
        "PASS_TO_PASS": ["tests/test_ops.py::test_add"],
        "image_name": "img:2",
        "repo": "swesmith/calc.abc",
        "problem_statement": "clamp is wrong",
    }
    r2e = {
        "repo_name": "calc",
        "docker_image": "img:3",
        "commit_hash": base,
        "problem_statement": "clamp is wrong",
        "parsed_commit_content": json.dumps(
            {
                "file_diffs": [
                    {"header": {"file": {"path": "calc/ops.py"}}, "new_file_content": "y\n"},
                    {"header": {"file": {"path": "tests/test_ops.py"}}, "new_file_content": "t\n"},
                ]
            }
        ),
        "expected_output_json": json.dumps(
            {"tests/test_ops.py::test_clamp_edges": "PASSED", "tests/test_ops.py::test_x": "FAILED"}
        ),
        "modified_files": ["calc/ops.py"],
        "relevant_files": [],
        "num_non_test_files": 1,
    }
    return {
        "swe-bench": swe_bench,
        "swe-gym": swe_gym,
        "swe-rebench": swe_rebench,
        "swe-smith": swe_smith,
        "r2e-gym": r2e,
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reads_into_a_loadable_task(tmp_path, fmt):
    rec = records("calc/calc", "a" * 40)[fmt]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    (inst,) = read_records(src, fmt)
    assert "tests/test_ops.py::test_clamp_edges" in inst.fail_to_pass
    task = load_task(write_task(inst, tmp_path / "out"))
    assert "clamp is wrong" in task.instruction
    config = json.loads((task.tests_dir / "config.json").read_text())
    assert config["fail_to_pass"] == list(inst.fail_to_pass)
    assert task.solution_dir is not None and task.restore_git_history
    dockerfile = task.environment.dockerfile.read_text()
    if fmt in ("swe-rebench", "swe-smith", "r2e-gym"):
        assert dockerfile.startswith(f"FROM {inst.image}")
    else:  # no local clone: a recipe that clones at build time
        assert "git clone" in dockerfile and "a" * 40 in dockerfile
    # the solution and the hidden tests never go into the image's build context
    context = {p.name for p in task.environment.path.rglob("*")}
    assert "gold.patch" not in context and "test.patch" not in context


def test_r2e_gym_solution_is_the_new_source_files_only(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(records("calc", "b" * 40)["r2e-gym"]) + "\n")
    (inst,) = read_records(src, "r2e-gym")
    assert inst.solution_files == {"calc/ops.py": "y\n"}
    assert inst.fail_to_pass == ("tests/test_ops.py::test_clamp_edges",)


def test_a_record_of_the_wrong_format_names_line_and_field(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n" + json.dumps(records("calc", "c" * 40)["swe-bench"]) + "\n")
    with pytest.raises(UsageError, match=r"in.jsonl:2: not a r2e-gym record: field 'commit_hash'"):
        list(read_records(src, "r2e-gym"))


def test_patch_files():
    assert patch_files(DIFF + TEST_DIFF) == ["calc/ops.py", "tests/test_ops.py"]


def test_mutations_change_one_node_and_keep_the_rest():
    src = "def f(a, b):\n    # keep me\n    if a < b:\n        return a + 1\n    return b\n"
    muts = list(mutations({"m.py": src}))
    kinds = {m.kind for m in muts}
    assert {"compare", "arith", "constant", "condition"} <= kinds
    for m in muts:
        assert "# keep me" in m.mutated and m.mutated != src
        compile(m.mutated, "m.py", "exec")
    assert any("(a <= b)" in m.mutated for m in muts)


def test_two_mutations_on_one_line_get_two_task_ids():
    # found on a real repository: two constants on one line wrote one task folder twice
    src = "def f(x):\n    return x + 1 if x > 0 else 2\n"
    muts = [m for m in mutations({"m.py": src}) if m.kind == "constant"]
    assert len(muts) == 3  # 1, 0 and 2
    assert len({m.name for m in muts}) == 3
    assert muts[0].name == "m-f-constant-l2"  # the first keeps the short name


def test_mutation_ids_make_valid_image_names():
    # found on real repositories: `pkg/__init__.py` and `_private` functions gave ids with
    # `-_`, which docker refuses in an image name
    src = "def _helper(x):\n    return x + 1\n"
    (mut,) = [m for m in mutations({"pkg/__init__.py": src}) if m.kind == "arith"]
    assert mut.name == "init-helper-arith-l2"
    assert re.fullmatch(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*", mut.name.lower())


def test_import_cli_from_a_local_clone(tmp_path, calc_repo):
    repo, shas = calc_repo
    rec = records(str(repo), shas["v1"])["swe-bench"]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    res = CliRunner().invoke(
        data,
        [
            "import",
            str(src),
            "--format",
            "swe-bench",
            "-o",
            str(tmp_path / "tasks"),
            "--offline",
            "--no-pytest",
        ],
    )
    assert res.exit_code == 0, res.output
    task = load_task(tmp_path / "tasks" / "calc__calc-1")
    assert (task.environment.path / "repo" / "calc" / "ops.py").read_text().count("value < high")
    # the snapshot holds the base commit's files and no history
    assert not (task.environment.path / "repo" / ".git").exists()
