"""No pod outlives its run: a killed run's pods go at the next start; ended pods go too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import pytest
from k8s_support import NAMESPACE, py_task, run
from slr_backend_k8s.api import PodGone
from slr_backend_k8s.backend import K8sBackend

from slr.contracts import SandboxError
from slr.sandboxing.labels import TRIAL
from slr.sandboxing.proxy_link import LINK_PREFIX, OWNER_FILE

pytestmark = pytest.mark.k8s

HERE = Path(__file__).resolve().parent

HOLDER = """
import asyncio, json, sys
sys.path[:0] = sys.argv[3:5]
from k8s_support import py_task
from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.backend import K8sBackend

async def main():
    backend = K8sBackend(K8sBackendConfig(**json.loads(sys.argv[1])))
    sandbox = await backend.start(py_task(), trial_id=sys.argv[2], labels={})
    print(sandbox.name, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_killed_runs_pods_are_removed_at_the_next_start(backend, sandbox, k8s_config, trial_id):
    config = json.dumps(attrs.asdict(k8s_config))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            config,
            trial_id + "-orphan",
            str(HERE),
            str(HERE.parents[2] / "tests"),  # service_readiness
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        name = ""
        for line in proc.stdout:  # its log lines come first; then the pod's name
            if line.startswith("slr-py-"):
                name = line.strip()
                break
        assert name, "the holder process never printed its pod's name"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # a crash: no clean-up code runs
        proc.wait()
    assert backend.list_pods(**{TRIAL: trial_id + "-orphan"}), "the pod should survive"

    fresh = K8sBackend(k8s_config)  # what the next run does first
    try:
        removed = run(fresh.cleanup_orphans())
    finally:
        run(fresh.close())
    assert removed >= 1
    assert backend.list_pods(**{TRIAL: trial_id + "-orphan"}) == []
    # ... and its proxy link folder on this machine.
    owners = [
        p.read_text() for p in Path(tempfile.gettempdir()).glob(f"{LINK_PREFIX}*/{OWNER_FILE}")
    ]
    assert str(proc.pid) not in owners
    # A live process's sandbox is not an orphan.
    assert run(sandbox.exec("echo still here")).stdout == "still here\n"
    net = backend.api.networking
    names = {p.metadata.name for p in net.list_namespaced_network_policy(NAMESPACE).items}
    assert name not in names


def test_a_pod_past_its_deadline_is_a_sandbox_error_and_cleaned_up(k8s_config, trial_id):
    b = K8sBackend(attrs.evolve(k8s_config, active_deadline_s=10))
    try:
        sb = run(b.start(py_task(), trial_id=trial_id, labels={}))
        deadline = time.monotonic() + 120
        while b.api.core.read_namespaced_pod(sb.name, NAMESPACE).status.phase != "Failed":
            if time.monotonic() > deadline:
                pytest.fail("the pod never hit its activeDeadlineSeconds")
            time.sleep(0.5)  # the cluster's own clock
        # The kubelet marks the pod Failed first and kills its container after (seconds on a
        # loaded node; the container's status in the API may never say so): until then a
        # command still runs. The first command that cannot run is the error under test.
        while True:
            try:
                run(sb.exec("true"))
            except SandboxError as exc:
                error = exc
                break
            if time.monotonic() > deadline:
                pytest.fail("the kubelet never stopped the container of a pod past its deadline")
            time.sleep(0.5)
        assert isinstance(error, PodGone), repr(error)
        assert "DeadlineExceeded" in str(error), str(error)
        assert run(b.cleanup_orphans()) >= 1  # ended pods go whoever made them
        assert b.list_pods(**{TRIAL: trial_id}) == []
        run(sb.stop())
    finally:
        run(b.close())
