"""The GPU check scripts stop at once, with a clear message, on a machine without a GPU.

This machine has no GPU: what they measure on one is not exercised here (bench/gpu/README.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU / script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=50,
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
