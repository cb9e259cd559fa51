"""The GPU check scripts stop at once, with a clear message, on a machine without a GPU;
their dry run (``SLR_GPU_DRY_RUN=1``) runs every command they make, on the CPU.

This machine has no GPU: what they measure on one is not exercised here (bench/gpu/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not _no_gpu(), reason="this check is for machines without a GPU"),
]


def _run(
    script: str, env: dict[str, str], *args: str, timeout: float = 50
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU / script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_torch_only_refuses_to_run_without_a_gpu(tmp_path):
    result = _run("torch_only.sh", {"PYTHON": sys.executable}, str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no GPU" in result.stderr and "torch.cuda.is_available() is false" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_torch_only_python_part_refuses_too(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_only_bench", GPU / "torch_only.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["torch_only.py"])
    assert module.main() == 2
    assert "no CUDA device is visible to torch" in capsys.readouterr().err


def test_cluster_node_refuses_to_run_without_a_gpu(tmp_path):
    path = f"{tmp_path}:/usr/bin:/bin"  # no nvidia-smi here
    result = _run("cluster_node.sh", {"PATH": path, "MODEL": str(tmp_path)})
    assert result.returncode == 2
    assert "no GPU: nvidia-smi is not on PATH" in result.stderr


def test_cluster_node_names_what_is_missing_before_starting(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 (stand-in for the GPU check)'\n")
    smi.chmod(0o755)
    env = {
        "PATH": f"{fake}:{ROOT / '.venv' / 'bin'}:/usr/bin:/bin",
        "MODEL": str(tmp_path / "none"),
    }
    result = _run("cluster_node.sh", env)
    assert result.returncode == 2
    assert "is not a model folder" in result.stderr


@pytest.mark.slow  # ~30 s of CPU: two tiny models trained and scored for real
@pytest.mark.timeout(600)
def test_torch_only_dry_run_runs_both_benches_with_the_arguments_they_take(tmp_path):
    env = {"PYTHON": sys.executable, "SLR_GPU_DRY_RUN": "1"}
    result = _run("torch_only.sh", env, str(tmp_path), timeout=580)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "failed" not in out and "skipped" not in out, out
    torch_only = json.loads((tmp_path / "torch_only.json").read_text())
    assert torch_only["device"] == "cpu" and "engine_bf16_vs_trainer_fp32" in torch_only["part_b"]
    replay = json.loads((tmp_path / "routing_replay.json").read_text())
    assert {r["replay"] for r in replay["rows"]} == {False, True}


@pytest.mark.parametrize(("engine", "optimizer"), [("sglang", "verl"), ("vllm", "torch")])
def test_cluster_node_dry_run_writes_a_config_slr_accepts_and_places_the_trainer(
    tmp_path, engine, optimizer
):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {
        "SLR_GPU_DRY_RUN": "1",
        "GPUS": "2",
        "ENGINE": engine,
        "OPTIMIZER": optimizer,
        "MODEL": str(model),
        "OUT": str(tmp_path / "run"),
        "PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin",  # no nvidia-smi, no engine
    }
    result = _run("cluster_node.sh", env, "--set", "run.steps=2")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "0 fatal" in out and "--set run.steps=2" in out
    assert "dry run: would run, with CUDA_VISIBLE_DEVICES=1:" in out
    config = tomllib.loads((tmp_path / "run" / "slr.toml").read_text())
    # the engine's server on GPU 0; the trainer, either one, on the only GPU slr sees (1)
    assert config["engine"]["gpus_per_replica"] == ["0"]
    assert config["optimizer"]["name"] == optimizer
    assert config["optimizer"]["device"] == "cuda" and config["optimizer"]["dtype"] == "bfloat16"
