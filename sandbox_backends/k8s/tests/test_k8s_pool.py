"""The warm sandbox pool on the k8s backend: pods started ahead of their trials, fresh, never
handed out twice, none left at the end of a run or after its SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from k8s_support import py_task, run
from slr_backend_k8s.backend import K8sBackend

from slr.sandboxing.labels import POOL
from slr.sandboxing.pool import PooledSandbox, SandboxPool

pytestmark = pytest.mark.k8s

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(180)
def test_pooled_pods_are_fresh_and_the_pool_shrinks_to_nothing(backend):
    task = py_task("pooled")

    async def main() -> None:
        pool = SandboxPool(backend, size=2)
        pool.expect([task, task, task])
        await pool.wait_ready()
        assert pool.warm == 2
        assert len(backend.list_pods(**{POOL: pool.pool_id})) == 2
        first = await pool.start(task, trial_id="t-pool-1", labels={})
        assert isinstance(first, PooledSandbox) and first.pool_start_s > 0
        assert (await first.exec("echo secret > /tmp/left-behind && echo hi")).stdout == "hi\n"
        await first.stop()
        second = await pool.start(task, trial_id="t-pool-2", labels={})
        assert second.id != first.id
        seen = await second.exec("cat /tmp/left-behind 2>&1 || echo absent")
        assert "absent" in seen.stdout  # nothing of the earlier trial
        await second.stop()
        await pool.drain()  # the end of a run (``close`` would also close the shared backend)
        assert pool.warm == 0
        assert backend.list_pods(**{POOL: pool.pool_id}) == []

    run(main())


@pytest.mark.timeout(180)
def test_a_broken_pooled_pod_is_replaced_not_handed_out(backend, k8s_config):
    task = py_task("pooled")

    async def main() -> None:
        pool = SandboxPool(backend, size=1)
        pool.expect([task])
        await pool.wait_ready()
        (pod,) = backend.list_pods(**{POOL: pool.pool_id})
        backend.api.core.delete_namespaced_pod(
            pod.metadata.name, k8s_config.namespace, grace_period_seconds=0
        )
        sandbox = await pool.start(task, trial_id="t-pool-3", labels={})
        try:
            assert pool.replaced == 1 and not isinstance(sandbox, PooledSandbox)
            assert (await sandbox.exec("echo ok")).stdout == "ok\n"
        finally:
            await sandbox.stop()
            await pool.drain()

    run(main())


HOLDER = """
import asyncio, json, sys
sys.path[:0] = sys.argv[2:4]
from k8s_support import py_task
from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.backend import K8sBackend
from slr.sandboxing.pool import SandboxPool

async def main():
    pool = SandboxPool(K8sBackend(K8sBackendConfig(**json.loads(sys.argv[1]))), size=2)
    pool.expect([py_task("orphan"), py_task("orphan")])
    await pool.wait_ready()
    print("ready", pool.pool_id, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.timeout(180)
def test_a_killed_runs_pooled_pods_are_removed_at_the_next_start(backend, k8s_config):
    config = json.dumps(attrs.asdict(k8s_config))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, config, str(HERE), str(HERE.parents[2] / "tests")],
        stdout=subprocess.PIPE,
        text=True,
    )
    pool_id = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # its log lines come first
            if line.startswith("ready "):
                pool_id = line.split()[1]
                break
        assert pool_id, "the holder process never filled its pool"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # a crash: no clean-up code runs
        proc.wait()
    assert len(backend.list_pods(**{POOL: pool_id})) == 2, "its pods should survive it"

    fresh = K8sBackend(k8s_config)  # what the next run does first
    try:
        removed = run(fresh.cleanup_orphans())
    finally:
        run(fresh.close())
    assert removed >= 2
    assert backend.list_pods(**{POOL: pool_id}) == []
