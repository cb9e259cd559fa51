"""bench/harness.py, what every benchmark shares: ``--json`` prints one JSON object and
nothing else on stdout, the table holds its rows, and the clock and memory figures are sane.

A bench written here (``_BENCH``) runs as a script, as ``python bench/x.py`` does, beside a
real one (``bench/records.py`` at its smallest size).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _harness():
    spec = importlib.util.spec_from_file_location("bench_harness", BENCH / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _harness()

_BENCH = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {bench!r})
    import harness

    p = harness.parser("A bench for the harness test.\\n\\nMore.", json_path={json_path})
    p.add_argument("--n", type=int, default=3)
    args = p.parse_args()
    out = harness.Output(args)
    rows = [[f"row-{{i}}", i * 1.5, None if i == 1 else i] for i in range(args.n)]
    out.table([("name", "<"), ("value", ".2f"), "count"], rows, title="the title")
    out.print("a note")
    out.result({{"n": args.n, "rows": rows}})
    """
)


def _run(tmp_path: Path, *args: str, json_path: bool = False) -> subprocess.CompletedProcess:
    script = tmp_path / "bench_x.py"
    script.write_text(_BENCH.format(bench=str(BENCH), json_path=json_path))
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60
    )


def test_json_flag_prints_one_object_and_nothing_else_on_stdout(tmp_path):
    done = _run(tmp_path, "--json", "--n", "4")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "n": 4,
        "rows": [["row-0", 0.0, 0], ["row-1", 1.5, None], ["row-2", 3.0, 2], ["row-3", 4.5, 3]],
    }
    assert done.stdout.count("\n") == 1
    # the table and the notes still reach a person, on stderr
    assert "the title" in done.stderr and "row-3" in done.stderr and "a note" in done.stderr


def test_without_json_the_table_holds_every_row_and_no_json(tmp_path):
    done = _run(tmp_path, "--n", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "the title"
    assert re.fullmatch(r"name\s+value\s+count", lines[1])
    assert [line.split() for line in lines[2:5]] == [
        ["row-0", "0.00", "0"],
        ["row-1", "1.50", "-"],
        ["row-2", "3.00", "2"],
    ]
    assert lines[5:] == ["a note"]
    assert "{" not in done.stdout


def test_json_path_writes_the_object_and_prints_one_json_line(tmp_path):
    target = tmp_path / "out.json"
    done = _run(tmp_path, "--json", str(target), "--n", "2", json_path=True)
    assert done.returncode == 0, done.stderr
    written = json.loads(target.read_text())
    assert written["n"] == 2 and len(written["rows"]) == 2
    assert "row-1" in done.stdout  # the table on stdout ...
    assert json.loads(done.stdout.splitlines()[-1]) == written  # ... and the JSON line last


def test_help_is_the_docstring_first_paragraph(tmp_path):
    done = _run(tmp_path, "--help")
    assert done.returncode == 0
    assert "A bench for the harness test." in done.stdout and "More." not in done.stdout
    assert "--json" in done.stdout


def test_a_real_bench_prints_one_json_object():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(BENCH / "records.py"), "--tokens", "64", "--segments", "2",
         "--repeat", "1", "--json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert set(figures["median_ms"]) == {"old", "new"}
    assert "round_trip" in done.stderr  # the table, on stderr


def test_table_columns_align_and_format():
    text = harness.table(
        [("name", "<"), ("ratio", harness.ratio), ("n", ">")],
        [["a", 2.0, "10"], ["longer", 0.5, "3"]],
    )
    assert text.splitlines() == [
        "name    ratio   n",
        "a       2.00x  10",
        "longer  0.50x   3",
    ]
    with pytest.raises(ValueError, match="2 cells under 3 columns"):
        harness.table(["a", "b", "c"], [[1, 2]])


def test_timed_measures_the_call_and_syncs_around_it():
    calls: list[str] = []

    def work() -> str:
        calls.append("work")
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass
        return "done"

    t0 = time.perf_counter()
    out, seconds = harness.timed(work, sync=lambda: calls.append("sync"))
    outer = time.perf_counter() - t0
    assert out == "done"
    assert calls == ["sync", "work", "sync"]
    assert 0.02 <= seconds <= outer


def test_median_timed_warms_up_then_takes_the_median():
    calls = []

    def work() -> int:
        calls.append(1)
        return len(calls)

    last, seconds = harness.median_timed(work, repeats=3, warmup=2)
    assert len(calls) == 5 and last == 5
    assert 0 <= seconds < 1
    with pytest.raises(ValueError, match="repeats=0"):
        harness.median_timed(work, repeats=0)


def test_rss_is_this_process_and_its_peak_sees_an_allocation():
    now = harness.rss_mb()
    assert 5 < now < 64 * 1024  # MiB: a Python process, not bytes or KiB
    assert harness.rss_mb(os.getpid()) == pytest.approx(now, rel=0.5)
    harness.reset_peak_rss()
    block = b"x" * (200 * 2**20)  # written, so resident
    assert harness.rss_mb(peak=True) >= now + 150
    del block
    assert harness.rss_mb(2**22 + 12345) == 0.0  # no such process


def _bench_scripts() -> list[Path]:
    return sorted(
        p for p in [*BENCH.glob("*.py"), *BENCH.glob("gpu/*.py")] if p.name != "harness.py"
    )


def test_no_bench_keeps_its_own_copy_of_what_the_harness_holds():
    # one home per concern: a bench takes --json, the clock and memory figures from harness
    own = {
        r'add_argument\(\s*"--json"': "--json (harness.parser)",
        r"^def (rss_mb|timed|median_timed)\(": "a clock or memory helper (harness)",
        r"/proc/(self|\{pid\})/status": "reads /proc/PID/status (harness.rss_mb)",
    }
    found = [
        f"{path.relative_to(BENCH.parent)}: {what}"
        for path in _bench_scripts()
        for pattern, what in own.items()
        if re.search(pattern, path.read_text(), re.MULTILINE)
    ]
    assert not found, found
