"""The private local Ray (``[run] ray_address`` unset): on 127.0.0.1, shared, stopped by
its last user. Run in a child process: a process holds one Ray connection, and the test
session's is the simulated cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = """
import json, sys
import ray  # imported early on purpose, as a library might: Ray has read its switches
from slr.cluster import ray_runtime

first = ray_runtime.connect(None, num_cpus=1)
second = ray_runtime.connect("local")
addresses = sorted({n["NodeManagerAddress"] for n in ray.nodes()})
first.release()
up_after_one = ray.is_initialized()
second.release()
print(json.dumps({"addresses": addresses, "gcs": first.address, "started": first.started,
                  "up_after_one": up_after_one, "up_after_all": ray.is_initialized()}))
"""


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_local_ray_stays_on_loopback_and_stops_with_its_last_user():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=170, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["addresses"] == ["127.0.0.1"]
    assert result["gcs"].startswith("127.0.0.1:")
    assert result["started"] is True
    assert result["up_after_one"] is True and result["up_after_all"] is False
