"""LoRA weight updates to vLLM without a server: the refusal of an adapter above
``max_lora_rank`` and the launch flags. The adapter loaded by the real server (its folder,
``/v1/load_lora_adapter`` in place, the log-probs of the adapted model) is tested in
test_vllm_real_lora.py."""

from __future__ import annotations

import asyncio

import pytest
import torch
from slr_engine_vllm.config import VllmEngineConfig
from slr_engine_vllm.engine import VllmEngine
from slr_engine_vllm.server import serve_command

from slr.contracts.weights import LoraSpec, WeightUpdate
from slr.errors import UsageError

MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj")


def _update(rank: int = 4) -> WeightUpdate:
    tensors = {}
    for m in MODULES:
        tensors[f"{m}.lora_A.weight"] = torch.full((rank, 8), 0.5)
        tensors[f"{m}.lora_B.weight"] = torch.full((8, rank), 0.25)
    spec = LoraSpec(rank=rank, alpha=8, modules=MODULES, base_model="Org/Base")
    return WeightUpdate(tensors=tensors, kind="lora", lora=spec)


def test_lora_needs_max_lora_rank_and_launched_servers_get_the_flags():
    config = VllmEngineConfig(model="m", max_context=64)

    async def refused():
        engine = VllmEngine(config, url="http://vllm", tokenizer=object())
        await engine.update_weights(_update(rank=16))

    with pytest.raises(UsageError, match=r"max_lora_rank >= 16 \(now 0\)"):
        asyncio.run(refused())
    cmd = serve_command(
        VllmEngineConfig(model="m", max_lora_rank=16), executable="vllm", port=1, max_context=0
    )
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in cmd
    assert "--enable-lora" not in serve_command(config, executable="vllm", port=1, max_context=0)
