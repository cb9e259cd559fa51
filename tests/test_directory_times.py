"""The table of time per test directory that tests/conftest.py prints at the end of a run."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _conftest():
    # By path: every conftest of the suite is a module named `conftest`, so the name alone
    # may find another folder's.
    spec = importlib.util.spec_from_file_location("slr_tests_conftest", HERE / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_test_counts_toward_its_top_level_directory():
    directory_of = _conftest().directory_of
    assert directory_of("tests/security/test_x.py::test_y[k8s]") == "tests/security"
    assert directory_of("tests/plugins/engine_hf/test_e.py::T::test_m") == "tests/plugins"
    assert directory_of("tests/test_lock.py::test_lock") == "tests"


def copy_conftest(tests: Path) -> None:
    """The suite's conftest.py, with the module it imports (the services' readiness)."""
    for name in ("conftest.py", "service_readiness.py"):
        shutil.copy(HERE / name, tests / name)


def test_the_summary_sums_each_directory(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    tests = tmp_path / "tests"
    for folder, body in {
        "fast": "def test_a(): pass\ndef test_b(): pass\n",
        "slow/deeper": "import time\ndef test_c(): time.sleep(0.3)\n",
    }.items():
        (tests / folder).mkdir(parents=True)
        (tests / folder / f"test_{folder.replace('/', '_')}.py").write_text(body)
    (tests / "test_top.py").write_text("def test_d(): pass\n")
    copy_conftest(tests)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    table = out.stdout.split("time per test directory", 1)[1].splitlines()[2:]
    table = table[: next(i for i, line in enumerate(table) if line.startswith("total")) + 1]
    rows = {line.split()[0]: line.split()[1:] for line in table}
    assert rows["tests/slow"][0] == "1" and float(rows["tests/slow"][1]) >= 0.3, table
    assert rows["tests/fast"][0] == "2" and rows["tests"][0] == "1", table
    assert rows["total"][0] == "4", table
    seconds = [float(line.split()[2]) for line in table[:-1]]
    assert seconds == sorted(seconds, reverse=True), table  # slowest first
    assert abs(sum(seconds) - float(rows["total"][1])) < 0.2, table


def test_figures_reach_the_terminal_from_xdist_workers(tmp_path):
    """A figure a test records (its report's user_properties) is printed at the end of the
    run, under pytest-xdist too, where only the controller prints and it sees nothing of a
    worker but its reports (the vLLM figures used to be kept in a list in the test process:
    a parallel run printed none)."""
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    tests = tmp_path / "tests" / "measuring"
    tests.mkdir(parents=True)
    (tests / "test_m.py").write_text(
        "def test_m(request):\n"
        "    request.node.user_properties.append(('figure', 'speed', {'tokens_per_s': 12.5}))\n"
    )
    copy_conftest(tmp_path / "tests")
    for workers in (["-p", "no:xdist"], ["-n", "2"]):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *workers, "tests"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "figures measured by the tests" in out.stdout, (workers, out.stdout)
        assert "speed: tokens_per_s=12.5" in out.stdout, (workers, out.stdout)
