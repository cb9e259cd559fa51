"""SGLang weight updates through a torch.distributed group and from shared-memory tensors,
for real on this CPU: the engine (rank 0) and an SGLang STAND-IN running as its own
process (SGLang needs a GPU) join a gloo group and broadcast the policy's tensors into the
stand-in's hf model; the tensor route hands them over in shared memory. What the stand-in
cannot show (SGLang's own loader, nccl between GPUs, CUDA IPC) is in the plugin README.

One stand-in process serves the module: every test pushes a full state dict before it
checks what the server computes, so no test depends on another's weights.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest
import sglang_schema as schema
import sglang_standin
import torch
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.engine import SglangEngine
from test_sglang_engine import reference_logprobs

from slr.contracts import EngineUnavailable, SamplingParams
from slr.contracts.weights import buckets
from slr.engines.server import ServerProcess, free_port
from slr_testkit import tiny

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # a server process loads a model

BUCKET = 64 * 1024  # the tiny model is ~1 MB: a few dozen buckets


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dense):
    """The stand-in, launched as SGLang would be, serving the tiny model's folder."""
    folder = tiny.save(*tiny_dense, tmp_path_factory.mktemp("model") / "m")
    port = free_port("127.0.0.1")
    script = Path(sglang_standin.__file__).resolve()
    process = ServerProcess(
        [sys.executable, str(script), "-m", "sglang.launch_server", "--model-path",
         str(folder), "--host", "127.0.0.1", "--port", str(port), "--context-length", "256"],
        kind="sglang-standin",
        url=f"http://127.0.0.1:{port}",
        log_dir=str(tmp_path_factory.mktemp("logs")),
    )  # fmt: skip

    async def ready():
        async with httpx.AsyncClient() as client:
            await process.wait_ready(client, 90)

    asyncio.run(ready())
    yield process
    process.stop()


@pytest.fixture
def connect(server, tokenizer_dir, tiny_dense):
    """``connect(**options)``: a started engine on the stand-in process (closed after)."""
    engines: list[SglangEngine] = []

    def make(**options) -> SglangEngine:
        options = {
            "weight_update": "distributed",
            "weight_group_backend": "gloo",
            "trainer_address": "127.0.0.1",
            "weight_bucket_bytes": BUCKET,
            "weight_group_timeout_s": 30.0,
            **options,
        }
        config = SglangEngineConfig(
            model="m", tokenizer=str(tokenizer_dir), urls=[server.url], **options
        )
        engine = SglangEngine(config, url=server.url, tokenizer=tiny_dense[1])
        asyncio.run(engine.start())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        asyncio.run(engine.close())


def recorded(server, path: str) -> list:
    """Bodies of the requests to ``path`` the stand-in process received, in order."""
    requests = httpx.get(f"{server.url}/standin/requests", timeout=30).json()
    return [r["body"] for r in requests if r["path"] == path]


def mine(bodies: list, group_name: str) -> list:
    """The bodies that name ``group_name`` (other tests' engines open groups of their own)."""
    return [b for b in bodies if b.get("group_name") == group_name]


def perturbed(model, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


class LiveTensors(Mapping[str, torch.Tensor]):
    """A state dict read lazily (as verl's optimizer exports it: each tensor gathered when
    read), counting how many of the tensors it handed out are alive at once."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self._state = state
        self.alive = 0
        self.most_alive = 0

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._state[name].clone()
        self.alive += 1
        self.most_alive = max(self.most_alive, self.alive)
        weakref.finalize(tensor, self._gone)
        return tensor

    def _gone(self) -> None:
        self.alive -= 1

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def serves(engine, model, state, *, seed: int) -> float:
    """The largest |log-prob difference| between what the server sampled and the trainer's
    forward pass under ``state``."""
    prompt = [4, 5, 6, 7]
    gen = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=4, seed=seed)))
    expected = reference_logprobs(model, state, prompt, gen.token_ids, 1.0)
    return max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True))


def test_distributed_updates_broadcast_bucket_by_bucket_into_the_served_model(
    connect, server, tiny_dense
):
    model, _ = tiny_dense
    engine = connect()
    new = perturbed(model, seed=1)
    lazy = LiveTensors(new)
    assert asyncio.run(engine.update_weights(lazy)) == 1
    assert serves(engine, model, new, seed=3) < 1e-5
    # never the whole state dict: the bucket being sent, the next one (read ahead to know
    # which bucket is the last) and the tensor that did not fit in it
    sizes = [len(b) for b in buckets(new, BUCKET)]
    ahead = max(a + b for a, b in itertools.pairwise(sizes)) + 1
    assert lazy.most_alive <= ahead < len(new) and lazy.alive == 0

    [init] = recorded(server, "/init_weights_update_group")[-1:]
    assert (init["backend"], init["world_size"], init["rank_offset"]) == ("gloo", 2, 1)
    assert set(init) <= schema.INIT_WEIGHTS_UPDATE_GROUP_FIELDS
    updates = mine(recorded(server, "/update_weights_from_distributed"), init["group_name"])
    assert len(updates) > 3 and [n for u in updates for n in u["names"]] == list(new)
    for body in updates:
        assert set(body) <= schema.UPDATE_WEIGHTS_FROM_DISTRIBUTED_FIELDS
        nbytes = sum(
            torch.empty(0, dtype=getattr(torch, d)).element_size() * torch.Size(s).numel()
            for d, s in zip(body["dtypes"], body["shapes"], strict=True)
        )
        assert nbytes <= BUCKET or len(body["names"]) == 1
    # the version changes, and the prefix cache is flushed, once every tensor is in
    assert [u.get("weight_version") for u in updates] == [None] * (len(updates) - 1) + ["1"]
    assert [u["flush_cache"] for u in updates] == [False] * (len(updates) - 1) + [True]

    newer = perturbed(model, seed=2)
    assert asyncio.run(engine.update_weights(newer, version=7)) == 7
    assert serves(engine, model, newer, seed=4) < 1e-5
    assert len(recorded(server, "/init_weights_update_group")) == 1  # the group is kept
    asyncio.run(engine.close())
    assert recorded(server, "/destroy_weights_update_group") == [{"group_name": init["group_name"]}]


def test_a_partial_update_over_the_group_resumes_under_the_new_weights(connect, server, tiny_dense):
    model, _ = tiny_dense
    engine = connect()
    old = perturbed(model, seed=5)
    asyncio.run(engine.update_weights(old))
    new = perturbed(model, seed=6)
    prompt = [7, 8, 9, 10]

    async def run():
        chunks = []
        stream = engine.stream(prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=5))
        chunks.append(await anext(stream))
        update = asyncio.ensure_future(engine.update_weights(new, mode="partial"))
        async for chunk in stream:
            chunks.append(chunk)
        return chunks, await update

    httpx.post(f"{server.url}/standin/hold_after", json={"tokens": 3}, timeout=30)
    chunks, version = asyncio.run(run())
    tokens = [t for c in chunks for t in c.token_ids]
    versions = [v for c in chunks for v in c.weights_versions]
    k = versions.count(1)
    assert version == 2 and 1 <= k <= 3 and versions == [1] * k + [2] * (len(tokens) - k)
    lps = [lp for c in chunks for lp in c.logprobs]
    expected = reference_logprobs(model, old, prompt, tokens[:k], 1.0)
    expected += reference_logprobs(model, new, prompt, tokens, 1.0)[k:]
    assert max(abs(a - b) for a, b in zip(lps, expected, strict=True)) < 1e-5


def test_tensor_updates_hand_the_tensors_over_in_shared_memory(connect, server, tiny_dense):
    model, _ = tiny_dense
    engine = connect(weight_update="tensor")
    new = perturbed(model, seed=8)
    before = len(recorded(server, "/update_weights_from_tensor"))
    assert asyncio.run(engine.update_weights(new, version=3)) == 3
    assert serves(engine, model, new, seed=5) < 1e-5
    bodies = recorded(server, "/update_weights_from_tensor")[before:]
    assert len(bodies) > 3 and bodies[-1]["weight_version"] == "3"
    assert all(len(b["serialized_named_tensors"]) == 1 for b in bodies)  # tp_size 1
    assert all(set(b) <= schema.UPDATE_WEIGHTS_FROM_TENSOR_FIELDS for b in bodies)
    # the bodies name shared-memory segments; the tensor data never travels over HTTP
    sent = sum(len(b["serialized_named_tensors"][0]) for b in bodies)
    assert sent < sum(t.numel() * t.element_size() for t in new.values()) / 10


def test_a_server_that_cannot_join_the_group_fails_the_update_with_its_reason(
    connect, server, tiny_dense
):
    engine = connect(weight_group_backend="nccl", weight_group_timeout_s=10.0)
    with pytest.raises(EngineUnavailable, match="refused to join the weight group") as info:
        asyncio.run(engine.update_weights(perturbed(tiny_dense[0], seed=9)))
    assert "NCCL" in str(info.value) or "nccl" in str(info.value)
    assert engine.weights_version == 0


def test_the_stand_ins_weight_answers_have_sglangs_shape(server):
    for path in (
        "/init_weights_update_group",
        "/update_weights_from_distributed",
        "/update_weights_from_tensor",
        "/destroy_weights_update_group",
    ):
        response = httpx.post(f"{server.url}{path}", json={"group_name": "none-such"})
        assert response.status_code == 400
        assert set(response.json()) <= schema.WEIGHT_UPDATE_RESPONSE_KEYS | {"error"}
    info = httpx.get(f"{server.url}/get_server_info").json()
    assert schema.SERVER_INFO_KEYS_READ <= set(info)
