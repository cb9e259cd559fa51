"""The table of time per test directory that the repository's conftest.py prints at the end
of a run."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _conftest():
    # By path: every conftest of the suite is a module named `conftest`, so the name alone
    # may find another folder's.
    spec = importlib.util.spec_from_file_location("slr_tests_conftest", ROOT / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_test_counts_toward_its_top_level_directory():
    directory_of = _conftest().directory_of
    assert directory_of("tests/security/test_x.py::test_y[k8s]") == "tests/security"
    assert directory_of("tests/adapters/x/test_e.py::T::test_m") == "tests/adapters"
    assert directory_of("tests/test_lock.py::test_lock") == "tests"
    # a distribution's own tests count toward the distribution
    assert directory_of("plugins/engine-hf/tests/test_e.py::T::test_m") == "plugins/engine-hf"
    assert directory_of("core/tests/proxy/test_p.py::t") == "core"
    assert directory_of("cli/tests/test_cli.py::t") == "cli"


PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["tests"]\n'


def copy_conftest(root: Path) -> None:
    """The repository's conftest.py at ``root``, with the module it imports from tests/
    (the services' readiness), on sys.path as in the repository (``PYPROJECT``)."""
    (root / "tests").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")
    shutil.copy(HERE / "service_readiness.py", root / "tests" / "service_readiness.py")
    (root / "pyproject.toml").write_text(PYPROJECT)


def test_the_summary_sums_each_directory(tmp_path):
    for folder, body in {
        "tests/fast": "def test_a(): pass\ndef test_b(): pass\n",
        "tests/slow/deeper": "import time\ndef test_c(): time.sleep(0.3)\n",
        "plugins/thing/tests": "def test_e(): pass\n",
    }.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / f"test_{folder.replace('/', '_')}.py").write_text(body)
    (tmp_path / "tests" / "test_top.py").write_text("def test_d(): pass\n")
    copy_conftest(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests", "plugins"],
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
    assert rows["plugins/thing"][0] == "1", table
    assert rows["total"][0] == "5", table
    seconds = [float(line.split()[2]) for line in table[:-1]]
    assert seconds == sorted(seconds, reverse=True), table  # slowest first
    assert abs(sum(seconds) - float(rows["total"][1])) < 0.2, table


def test_figures_reach_the_terminal_from_xdist_workers(tmp_path):
    """A figure a test records (its report's user_properties) is printed at the end of the
    run, under pytest-xdist too, where only the controller prints and it sees nothing of a
    worker but its reports (the vLLM figures used to be kept in a list in the test process:
    a parallel run printed none)."""
    tests = tmp_path / "tests" / "measuring"
    tests.mkdir(parents=True)
    (tests / "test_m.py").write_text(
        "def test_m(request):\n"
        "    request.node.user_properties.append(('figure', 'speed', {'tokens_per_s': 12.5}))\n"
    )
    copy_conftest(tmp_path)
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
