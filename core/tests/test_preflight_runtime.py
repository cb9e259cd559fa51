"""The core's checks of this machine's state and the run's topology, each tripped and
passed: runs in flight, a taken proxy port, Ray roles vs resources, GPU headroom, train /
held-out splits, and a sandbox reaching the proxy."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from slr import hookimpl
from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, gpus, run_checks, runtime_checks
from slr.run.directory import RunDir
from slr_testkit.runs import held_by_another_process

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"


def config(tmp_path, *sets: str, **choose):
    choose = {"agent": "nop", "backend": "local", **choose}
    return load_config(
        plugins=get_plugin_manager(),
        choose=choose,
        sets=[f'run.runs_dir="{tmp_path / "runs"}"', f'tasks.path="{TASKS}"', *sets],
    )


def check(name: str, cfg, purpose="run"):
    plugins = get_plugin_manager()
    [found] = [c for c in plugins.preflight_checks() if c.name == name]
    ctx = Context(config=cfg, plugins=plugins, purpose=purpose)
    return list(run_checks([found], ctx, stages=(found.stage,)).lines)


def one(name: str, cfg, purpose="run"):
    [line] = check(name, cfg, purpose)
    return line.result


def test_a_run_in_flight_under_runs_dir_warns_with_its_pid(tmp_path):
    cfg = config(tmp_path)
    assert one("runs-in-flight", cfg).status == "pass"
    run = RunDir.create(tmp_path / "runs", "busy", "[run]\n")
    with held_by_another_process(run.path) as proc:
        result = one("runs-in-flight", cfg)
        assert result.status == "warn" and f"pid {proc.pid}" in result.message
        assert run.id in result.message and "slr status" in result.fix
    assert one("runs-in-flight", cfg).status == "pass"


def test_a_taken_proxy_port_is_fatal_and_a_free_one_passes(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = one("proxy-port", config(tmp_path, f"proxy.port={port}"))
        assert result.status == "fatal" and f"proxy.port = {port} on 127.0.0.1 is taken" in (
            result.message
        )
        assert "proxy.port = 0" in result.fix
    # the same port, now free
    assert one("proxy-port", config(tmp_path, f"proxy.port={port}")).status == "pass"
    # 0 (a free port each run) needs no check
    assert check("proxy-port", config(tmp_path)) == []


def test_ray_roles_that_do_not_fit_this_machine_are_fatal(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_checks, "this_machine", lambda: [{"CPU": 2.0, "GPU": 0.0}])
    fits = one("ray-topology", config(tmp_path, "run.engine_replicas=1", "run.rollout_workers=1"))
    assert fits.status == "pass" and "CPU = 2" in fits.message
    gpu = one(
        "ray-topology", config(tmp_path, "run.engine_replicas=1", "run.engine_resources.GPU=1")
    )
    assert gpu.status == "fatal" and "no node of this machine" in gpu.message
    assert "run.engine_resources" in gpu.fix and "hang at start" in gpu.message
    many = one("ray-topology", config(tmp_path, "run.engine_replicas=2", "run.rollout_workers=2"))
    assert many.status == "fatal"
    assert "CPU = 4 (2 x 1 (engine_replicas) + 2 x 1 (rollout_workers))" in many.message
    # no Ray role: nothing to place
    assert check("ray-topology", config(tmp_path)) == []


def test_a_cluster_is_judged_by_its_nodes(tmp_path):
    roles = [("engine_replicas", 2, {"GPU": 2.0})]
    nodes = [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}]
    result = runtime_checks.fit(roles, nodes, "the cluster")
    # 3 GPUs in all, but only one node holds a replica's 2
    assert result.status == "fatal" and "GPU = 4" in result.message
    assert runtime_checks.fit(roles, [nodes[0], nodes[0]], "the cluster").status == "pass"


def stand_in_nvidia_smi(tmp_path, monkeypatch, rows: str) -> None:
    """An nvidia-smi stand-in (this machine has no GPU) printing ``rows`` for the query, in
    the format the real nvidia-smi of an H200 machine printed for it."""
    script = tmp_path / "nvidia-smi-stub"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{rows}\nEOF\n")
    script.chmod(0o755)
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(script))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_gpu_resources_on_a_machine_without_gpu_are_fatal(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(tmp_path / "no-nvidia-smi"))
    cfg = config(tmp_path, "run.engine_replicas=1", "run.engine_resources.GPU=1")
    result = one("gpu", cfg)
    assert result.status == "fatal" and "this machine has none visible" in result.message
    assert result.doc == "docs/troubleshooting/startup.md#no-gpu"
    stand_in_nvidia_smi(tmp_path, monkeypatch, "0, NVIDIA H200, 143771, 143156")
    assert one("gpu", cfg).status == "pass"
    stand_in_nvidia_smi(tmp_path, monkeypatch, "0, NVIDIA H200, 143771, 300")
    busy = one("gpu", cfg)
    assert busy.status == "fatal" and "another process holds it" in busy.message


def write_index(tmp_path, rows) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    index = tmp_path / "tasks.parquet"
    full = [
        {"id": i, "path": str(TASKS / i), "content_hash": h, "repo": r, "split": s}
        for i, h, r, s in rows
    ]
    pq.write_table(pa.Table.from_pylist(full), index)
    return index


def test_training_on_held_out_rows_or_overlapping_splits_is_fatal(tmp_path):
    index = write_index(
        tmp_path,
        [("hello-world", "a", "r1", "train"), ("fix-median", "b", "r2", "held-out")],
    )
    everything = config(tmp_path, f'tasks.path="{index}"')
    result = one("task-splits", everything)
    assert result.status == "fatal" and "1 of them held out" in result.message
    assert 'tasks.split = "train"' in result.fix
    assert (
        one("task-splits", config(tmp_path, f'tasks.path="{index}"', 'tasks.split="train"')).status
        == "pass"
    )
    # evaluating on all of it is not training on it
    assert one("task-splits", everything, purpose="eval").status == "pass"
    shared = write_index(
        tmp_path,
        [("hello-world", "a", "r1", "train"), ("fix-median", "b", "r1", "held-out")],
    )
    overlap = one("task-splits", config(tmp_path, f'tasks.path="{shared}"', 'tasks.split="train"'))
    assert overlap.status == "fatal" and "share 1 repo(s) (r1)" in overlap.message
    # and the loader honours the split
    from slr.tasks import load_tasks

    assert [t.id for t in load_tasks(index, split="held-out")] == ["fix-median"]


# -- a sandbox reaches the proxy -------------------------------------------------------------


class _BrokenLink:
    """A stand-in: the local backend whose sandboxes are told a dead proxy address."""

    @hookimpl
    def register_sandbox_backends(self, register):
        from slr_backend_local import LocalBackendConfig

        register("local-broken-link-stub", _broken_backend, config_cls=LocalBackendConfig)


def _broken_backend(options):
    from slr_backend_local.backend import LocalBackend

    class Backend(LocalBackend):
        async def start(self, task, **kw):
            sandbox = await super().start(task, **kw)
            sandbox.proxy_url = lambda url: "http://127.0.0.1:9/v1"  # discard port: nobody
            return sandbox

    return Backend(options)


@pytest.mark.timeout(90)
def test_a_sandbox_reaches_the_proxy_and_a_broken_link_is_fatal(tmp_path, slr_plugins):
    local = [f'backend.workspace_dir="{tmp_path / "ws"}"', 'tasks.include=["hello-world"]']
    result = one("proxy-reach", config(tmp_path, *local))
    assert result.status == "pass", result
    assert "reaches the proxy" in result.message
    slr_plugins.register(_BrokenLink(), name="broken-link", distribution="slr-test-stub")
    broken = one("proxy-reach", config(tmp_path, *local, backend="local-broken-link-stub"))
    assert broken.status == "fatal" and "does not reach the proxy" in broken.message
    assert broken.doc.endswith("#the-agent-never-reaches-the-proxy")
    # an eval with a model-free agent opens no proxy
    assert check("proxy-reach", config(tmp_path, *local), purpose="eval") == []
