"""LoRA weight updates to vLLM, against a STAND-IN of its HTTP API (vLLM needs a GPU; the
server's loading of the adapter cannot run here): the adapter folder written for the server,
the request sequence and bodies (``/v1/load_lora_adapter`` in place between ``/pause`` and
``/resume``), requests naming the adapter afterwards, the launch flags, and the errors."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
import vllm_standin
from slr_engine_vllm.config import VllmEngineConfig
from slr_engine_vllm.engine import VllmEngine
from slr_engine_vllm.server import serve_command

from slr.contracts import SamplingParams
from slr.contracts.weights import LoraSpec, WeightUpdate
from slr.errors import UsageError
from slr.lora import read_adapter

MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj")


def _update(rank: int = 4) -> WeightUpdate:
    tensors = {}
    for m in MODULES:
        tensors[f"{m}.lora_A.weight"] = torch.full((rank, 8), 0.5)
        tensors[f"{m}.lora_B.weight"] = torch.full((8, rank), 0.25)
    spec = LoraSpec(rank=rank, alpha=8, modules=MODULES, base_model="Org/Base")
    return WeightUpdate(tensors=tensors, kind="lora", lora=spec)


class ServerStandIn:
    """Answers vLLM's control and completion endpoints; records every request and, at the
    moment it is asked to load an adapter, what the folder it names holds."""

    def __init__(self) -> None:
        self.state = vllm_standin.StandInState(served_model_name="slr-policy")
        self.requests: list[tuple[str, dict | None]] = []
        self.loaded: list[WeightUpdate] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        if request.url.path == "/v1/load_lora_adapter":
            assert body is not None
            self.loaded.append(read_adapter(body["lora_path"]))
            self.state.served_model_name = body["lora_name"]  # vLLM then serves that name
            return httpx.Response(200, text=f"Success: LoRA adapter '{body['lora_name']}'")
        if request.url.path == "/v1/completions":
            status, payload = vllm_standin.completion(self.state, body or {})
            return httpx.Response(status, json=payload)
        return httpx.Response(200, json={})


@pytest.mark.timeout(60)
def test_a_lora_update_loads_the_adapter_in_place_and_requests_name_it(tmp_path):
    server = ServerStandIn()
    config = VllmEngineConfig(model="m", max_context=64, max_lora_rank=8, lora_dir=str(tmp_path))

    async def scenario():
        client = httpx.AsyncClient(transport=httpx.MockTransport(server))
        engine = VllmEngine(config, url="http://vllm", tokenizer=object(), client=client)
        first = await engine.update_weights(_update(), version=1)
        second = await engine.update_weights(_update(), version=2)
        gen = await engine.generate([1, 2], SamplingParams(max_tokens=2))
        await client.aclose()
        return first, second, gen

    first, second, gen = asyncio.run(scenario())
    assert (first, second, gen.weights_version) == (1, 2, 2)
    paths = [p for p, _ in server.requests]
    assert paths == [
        "/pause",
        "/v1/load_lora_adapter",
        "/resume",
        "/pause",
        "/v1/load_lora_adapter",
        "/resume",
        "/v1/completions",
    ]
    loads = [b for p, b in server.requests if p == "/v1/load_lora_adapter"]
    assert all(b is not None and b["lora_name"] == "slr-policy-lora" for b in loads)
    assert all(b is not None and b["load_inplace"] is True for b in loads)
    completion = next(b for p, b in server.requests if p == "/v1/completions")
    assert completion is not None and completion["model"] == "slr-policy-lora"
    # what the server read: the adapter's tensors under peft's names, its rank and alpha
    loaded = server.loaded[-1]
    assert loaded.lora is not None
    assert (loaded.lora.rank, loaded.lora.alpha, loaded.lora.modules) == (4, 8.0, MODULES)
    assert all(torch.equal(loaded[k], v) for k, v in _update().items())
    # only the newest adapter folder is kept (the server holds the adapter in memory)
    assert len([p for p in tmp_path.rglob("adapter_config.json")]) == 1


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
