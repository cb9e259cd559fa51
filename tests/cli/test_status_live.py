"""``slr status --json`` as the /rl:status skill reads it: whether a live process holds the
run (its pid), how it finished, or that it stopped; the newest run of a runs folder; every
run with ``--all``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slr.runs import RunDir
from slr.testing.runs import held_by_another_process

SLR = str(Path(sys.executable).with_name("slr"))


def status(*args: str):
    res = subprocess.run([SLR, "status", *args, "--json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


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
