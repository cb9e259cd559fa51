"""slr.agents.bundles: building a bundle once into the cache, and refusing broken ones.

The recipes here need no network: files written by the recipe itself, a failing build
command, and a real host tool (``host_tool``) copied with its libraries.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading

import pytest
from click.testing import CliRunner

from slr.agents import bundles
from slr.agents.bundle_recipes import find_python, host_tool, host_tools_bin, npm_packages
from slr.agents.bundles import MARKER, BuildStep, BundleError, Marker


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class Recipe:
    """Writes one file; counts its builds."""

    def __init__(self, text: str = "hello\n") -> None:
        self.text, self.builds = text, 0

    def __call__(self, step: BuildStep) -> None:
        self.builds += 1
        (step.path / "hello.txt").write_text(self.text)


def test_a_bundle_is_built_once_into_the_cache_with_its_marker(cache):
    recipe = Recipe()
    bundle = bundles.ensure("tiny", "1.0", recipe)
    assert bundle.path == cache / "bundles" / "tiny-1.0" and bundle.version == "1.0"
    assert (bundle.path / "hello.txt").read_text() == "hello\n"
    marker = Marker.read(bundle.path)
    assert marker is not None and (marker.name, marker.version) == ("tiny", "1.0")
    assert not list((cache / "bundles").glob(".tiny-1.0.building"))
    # a cache hit: the same bundle, the recipe not run again
    assert bundles.ensure("tiny", "1.0", recipe) == bundle
    assert recipe.builds == 1
    assert bundles.existing("tiny", "1.0") == bundle
    # another version is another bundle
    other = bundles.ensure("tiny", "2.0", recipe)
    assert other.path.name == "tiny-2.0" and recipe.builds == 2


@pytest.mark.parametrize(
    "marker",
    [
        None,  # killed before the marker was written
        '{"name": "tiny", "vers',  # cut short
        json.dumps({"name": "tiny", "version": "0.9"}),  # another bundle's folder
    ],
    ids=["no-marker", "cut-marker", "foreign-marker"],
)
def test_a_partial_or_foreign_folder_is_not_used_but_rebuilt(cache, marker):
    folder = cache / "bundles" / "tiny-1.0"
    folder.mkdir(parents=True)
    (folder / "junk.txt").write_text("half a build")
    if marker is not None:
        (folder / MARKER).write_text(marker)
    building = cache / "bundles" / ".tiny-1.0.building"
    building.mkdir()
    assert bundles.existing("tiny", "1.0") is None
    recipe = Recipe()
    bundle = bundles.ensure("tiny", "1.0", recipe)
    assert recipe.builds == 1
    assert sorted(p.name for p in bundle.path.iterdir()) == [MARKER, "hello.txt"]
    assert not building.exists()


def test_a_failed_recipe_leaves_nothing_and_the_next_call_builds(cache):
    def broken(step: BuildStep) -> None:
        (step.path / "half.txt").write_text("x")
        raise RuntimeError("recipe broke")

    with pytest.raises(RuntimeError, match="recipe broke"):
        bundles.ensure("tiny", "1.0", broken)
    assert [p.name for p in (cache / "bundles").iterdir() if not p.name.endswith(".lock")] == []
    assert bundles.existing("tiny", "1.0") is None
    assert bundles.ensure("tiny", "1.0", Recipe()).path.is_dir()


def test_a_failing_build_command_names_the_command_its_exit_code_and_output(cache):
    def recipe(step: BuildStep) -> None:
        step.run(["sh", "-c", "echo fetching; echo no space left on device >&2; exit 3"])

    with pytest.raises(BundleError) as info:
        bundles.ensure("tiny", "1.0", recipe)
    message = str(info.value)
    assert message.startswith("building bundle tiny-1.0: `sh -c echo fetching;")
    assert "exited with 3" in message
    assert "no space left on device" in message  # the output's tail, stderr included
    assert "run again" in message
    assert bundles.existing("tiny", "1.0") is None


def test_concurrent_builds_of_one_bundle_run_the_recipe_once(cache):
    entered, release = threading.Event(), threading.Event()
    builds = []

    def slow(step: BuildStep) -> None:
        builds.append(step.path)
        entered.set()
        assert release.wait(60)
        (step.path / "hello.txt").write_text("hello\n")

    results = []
    first = threading.Thread(target=lambda: results.append(bundles.ensure("tiny", "1", slow)))
    first.start()
    assert entered.wait(60)
    # the second caller finds the first one's build under way: it waits, then reuses it
    second = threading.Thread(target=lambda: results.append(bundles.ensure("tiny", "1", slow)))
    second.start()
    release.set()
    first.join(60)
    second.join(60)
    assert len(builds) == 1
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0].path / "hello.txt").read_text() == "hello\n"


def test_the_marker_shell_test_matches_what_the_writer_wrote(cache):
    bundle = bundles.ensure("tiny", "1.0+local", Recipe())

    def holds(version: str) -> bool:
        test = Marker.shell_test(str(bundle.path), version)
        return subprocess.run(["sh", "-c", test]).returncode == 0

    assert holds("1.0+local")
    assert not holds("1.0") and not holds("2.0")


def test_a_host_tool_bundle_runs_wherever_it_is_mounted(cache, tmp_path):
    bundle = bundles.ensure("tool", "1", lambda step: host_tool(step, "tar", hint="install tar"))
    moved = tmp_path / "mounted-elsewhere"
    shutil.copytree(bundle.path, moved, symlinks=True)
    res = subprocess.run(
        [f"{host_tools_bin(str(moved))}/tar", "--version"],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent"},
    )
    assert res.returncode == 0, res.stderr
    assert "tar" in res.stdout


def test_a_missing_build_tool_names_what_to_install(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(BundleError, match="'npm' is not on PATH; install npm"):
        bundles.ensure("js", "1", lambda step: npm_packages(step, ["left-pad@1.3.0"]))
    assert bundles.existing("js", "1") is None


def test_no_python_of_the_wanted_version_names_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.delenv("SLR_BUNDLE_PYTHON", raising=False)
    with pytest.raises(BundleError) as info:
        find_python("3.99", explicit=str(tmp_path / "no-such-python"))
    message = str(info.value)
    assert "no self-contained Python 3.99" in message
    assert str(tmp_path / "no-such-python") in message  # where it looked
    assert "pyenv install 3.99" in message and "SLR_BUNDLE_PYTHON" in message


def test_bundles_list_shows_built_bundles_and_skips_broken_ones(cache):
    from slr.agents.bundles_cli import bundles_group

    bundles.ensure("tiny", "1.0", Recipe())
    broken = cache / "bundles" / "tiny-0.1"
    broken.mkdir()
    (broken / MARKER).write_text("{")
    res = CliRunner().invoke(bundles_group, ["list", "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [(r["name"], r["version"]) for r in rows] == [("tiny", "1.0")]
    assert rows[0]["path"] == str(cache / "bundles" / "tiny-1.0")
