"""Suite-wide, for every test folder (``tests/`` and each distribution's own ``tests/``).

The time spent per test directory, printed at the end of the run: ``--durations`` names the
slowest tests; this table says where the whole run's time went (``.ci/run`` prints it
last), so a directory that grew slow shows at a glance. Each test's setup, call and
teardown count toward its distribution (``plugins/engine-hf`` for
``plugins/engine-hf/tests/...``, ``core``, ``cli``) or, under ``tests/``, toward its
top-level directory there (``tests/security``; the files directly in ``tests/`` count as
``tests``). A fixture shared across directories counts toward the test that set it up.
Under pytest-xdist the table sums the workers' time, so its total exceeds the wall-clock
time of the run.

Tests that measure something (the real vLLM's log-prob fidelity, its abort latency) put
``("figure", what, {name: value})`` in their report's ``user_properties``; the figures are
printed after the table, from the reports, so they reach the terminal from a worker too.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path, PurePosixPath

import pytest

_seconds: defaultdict[str, float] = defaultdict(float)
_tests: defaultdict[str, set[str]] = defaultdict(set)
_figures: list[str] = []


def directory_of(nodeid: str) -> str:
    """``tests/security`` for ``tests/security/x/test_y.py::t``, ``tests`` for a file
    there; ``plugins/engine-hf`` for ``plugins/engine-hf/tests/test_e.py::t``."""
    parts = PurePosixPath(nodeid.split("::", 1)[0]).parts
    if len(parts) >= 3 and parts[0] == "tests":
        return "/".join(parts[:2])
    if "tests" in parts[1:-1]:
        return "/".join(parts[: parts.index("tests", 1)])
    return parts[0] if len(parts) > 1 else "."


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    directory = directory_of(report.nodeid)
    _seconds[directory] += report.duration
    _tests[directory].add(report.nodeid)
    for entry in report.user_properties if report.when == "call" else ():
        if len(entry) == 3 and entry[0] == "figure":
            _, what, figures = entry
            shown = ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
            )
            _figures.append(f"{what}: {shown}")


@pytest.hookimpl(trylast=True)  # after --durations: the last table before the summary line
def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    total = sum(_seconds.values())
    width = max(len("directory"), *(len(d) for d in _seconds))
    terminalreporter.write_sep("=", "time per test directory (setup + call + teardown)")
    terminalreporter.write_line(
        f"{'directory':<{width}}  {'tests':>6}  {'seconds':>9}  {'share':>6}"
    )
    for directory, seconds in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        share = seconds / total if total else 0.0
        terminalreporter.write_line(
            f"{directory:<{width}}  {len(_tests[directory]):>6}  {seconds:>9.1f}  {share:>6.1%}"
        )
    tests = sum(len(t) for t in _tests.values())
    terminalreporter.write_line(f"{'total':<{width}}  {tests:>6}  {total:>9.1f}  {1:>6.1%}")
    if _figures:
        terminalreporter.write_sep("-", "figures measured by the tests")
        for line in _figures:
            terminalreporter.write_line(line)


# -- services: each marked test waits for its service to be ready (tests/service_readiness.py)
# (tests/ is on sys.path: `pythonpath` in pyproject.toml)

from service_readiness import BY_MARKER, docker_daemon, k8s_cluster  # noqa: E402, F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test marked ``k8s`` or ``docker`` sets up that service's readiness fixture
    first, so no test (nor any of its own fixtures) reaches a service before it is ready."""
    for item in items:
        names = getattr(item, "fixturenames", None)
        if names is None:
            continue
        needs = [
            fixture for marker, fixture in BY_MARKER.items() if item.get_closest_marker(marker)
        ]
        if needs:
            # a new list: the parametrized instances of one test share the collected one
            item.fixturenames = [*needs, *(n for n in names if n not in needs)]


# -- models the tests share -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random model (SmolLM2's tokenizer, one layer of width 32) saved as a model
    folder: what the loop and end-to-end tests train, in seconds."""
    from slr_testkit import tiny

    model, tok = tiny.tiny_model(hidden=32, layers=1)
    return tiny.save(model, tok, tmp_path_factory.mktemp("tiny") / "model")
