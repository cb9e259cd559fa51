"""``slr status --json`` as the /rl:status skill reads it: whether a live process holds the
run (its pid), how it finished, or that it stopped; the newest run of a runs folder; every
run with ``--all``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slr.run.directory import RunDir
from slr_cli.status_cmd import status as status_cmd
from slr_testkit.runs import held_by_another_process


def status(*args: str):
    res = CliRunner().invoke(status_cmd, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.timeout(90)
def test_status_tells_running_from_finished_and_stopped(tmp_path):
    runs = tmp_path / "runs"
    old = RunDir.create(runs, "old", "[run]\nsteps = 3\n")
    old.append_event("started", resumed=False, step=0)
    old.append_event("finished", status="completed")
    old.close()
    new = RunDir.create(runs, "new", "[run]\nsteps = 2\n")
    new.append_event("started", resumed=False, step=0)
    new.close()
    with held_by_another_process(new.path) as proc:
        info = status(str(runs))  # a runs folder: its newest run
        assert info["path"] == str(new.path)
        assert info["state"] == "running" and info["live"]["pid"] == proc.pid
        assert info["steps_planned"] == 2
        every = {r["run_id"]: r for r in status(str(runs), "--all")}
        assert every[new.id]["state"] == "running" and every[old.id]["state"] == "completed"
    info = status(str(new.path))
    assert info["state"] == "stopped" and info["live"] is None
    assert status(str(old.path))["state"] == "completed"
