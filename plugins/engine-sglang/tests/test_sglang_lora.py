"""LoRA updates on the SGLang engine, against the STAND-IN (SGLang needs a GPU): the engine
writes the adapter folder, loads it under a fresh name per version with
``/load_lora_adapter``, unloads the previous one, and every later ``/generate`` names it.
The stand-in really reads the folder and applies the adapter to its hf model with peft's
layers, so the served log-probs are checked against the adapted model's own forward pass."""

from __future__ import annotations

import asyncio

import pytest
import sglang_standin
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.server import launch_command

from slr.contracts import EngineUnavailable, SamplingParams
from slr.contracts.weights import LoraSpec, WeightUpdate
from slr.engines.lora import is_adapter_folder, load_weights
from slr.errors import UsageError

pytestmark = pytest.mark.timeout(120)
RANK = 4


@pytest.fixture
def base_state(lora_model):
    return {k: v.clone() for k, v in lora_model[0].state_dict().items()}


@pytest.fixture
def connect(attach):
    """``connect(server, **options)``: a started SglangEngine with LoRA on that stand-in."""
    return lambda server, **options: attach(server, **{"max_lora_rank": 8, **options})


def lora_update(base_state, *, seed: int, targets=("q_proj", "v_proj"), rank=RANK):
    """A LoRA update over ``targets`` with random A and B (B nonzero: it changes outputs),
    shaped from the base's weights (the served model itself carries peft's layers by now)."""
    gen = torch.Generator().manual_seed(seed)
    tensors, modules = {}, []
    for key, weight in base_state.items():
        name = key.removesuffix(".weight")
        if key.endswith(".weight") and name.rsplit(".", 1)[-1] in targets:
            modules.append(name)
            out_features, in_features = weight.shape
            a = torch.randn(rank, in_features, generator=gen) * 0.3
            b = torch.randn(out_features, rank, generator=gen) * 0.3
            tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"] = a, b
    spec = LoraSpec(rank=rank, alpha=2 * rank, modules=tuple(modules))
    return WeightUpdate(tensors=tensors, kind="lora", lora=spec)


def served_vs_adapted(model, base_state, update, prompt, tokens):
    """log_softmax of each token from one fp32 forward of the base with ``update`` applied
    by peft's layers (what the trainer computes); ``update`` None: the base alone."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    ref.load_state_dict(base_state)
    if update is not None:
        load_weights(ref, update)
    ref.eval()
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor([list(prompt) + list(tokens)])).logits[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def _posts(server, path):
    return [r["body"] for r in server.requests if r["path"] == path]


def test_each_lora_update_loads_a_fresh_adapter_and_generate_names_it(
    lora_standin, connect, lora_model, base_state
):
    model, _ = lora_model
    engine = connect(lora_standin)
    prompt, params = [4, 5, 6, 7], SamplingParams(max_tokens=6, seed=2)
    names = []
    for version, seed in ((1, 11), (2, 12)):
        update = lora_update(base_state, seed=seed)
        assert asyncio.run(engine.update_weights(update)) == version == engine.weights_version
        load = _posts(lora_standin, "/load_lora_adapter")[-1]
        assert set(load) == {"lora_name", "lora_path"} and is_adapter_folder(load["lora_path"])
        names.append(load["lora_name"])
        assert list(lora_standin.adapters) == [load["lora_name"]]  # the previous one unloaded
        assert _posts(lora_standin, "/update_weight_version")[-1]["new_version"] == str(version)
        gen = asyncio.run(engine.generate(prompt, params))
        assert _posts(lora_standin, "/generate")[-1]["lora_path"] == load["lora_name"]
        assert set(gen.weights_versions) == {version}
        expected = served_vs_adapted(model, base_state, update, prompt, gen.token_ids)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 1e-5
    assert names[0] != names[1]
    assert _posts(lora_standin, "/unload_lora_adapter") == [{"lora_name": names[0]}]
    # the adapter matters: the base alone scores the last tokens differently
    base = served_vs_adapted(model, base_state, None, prompt, gen.token_ids)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, base, strict=True)) > 1e-2
    asyncio.run(engine.close())
    assert lora_standin.adapters == {}  # an attached server outlives us: nothing left behind


def test_a_partial_lora_update_resumes_each_generation_under_the_new_adapter(
    lora_standin, connect, lora_model, base_state
):
    model, _ = lora_model
    engine = connect(lora_standin)
    update = lora_update(base_state, seed=21)
    prompt = [7, 8, 9, 10]
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5)

    async def run():
        chunks = []
        stream = engine.stream(prompt, params)
        chunks.append(await anext(stream))
        pending = asyncio.ensure_future(engine.update_weights(update, mode="partial"))
        async for chunk in stream:
            chunks.append(chunk)
        return chunks, await pending

    lora_standin.hold_after = 3  # still generating when the update comes
    chunks, version = asyncio.run(run())
    assert version == 1
    tokens = [t for c in chunks for t in c.token_ids]
    lps = [lp for c in chunks for lp in c.logprobs]
    versions = [v for c in chunks for v in c.weights_versions]
    k = versions.count(0)
    assert 1 <= k <= 3 and versions == [0] * k + [1] * (len(tokens) - k) and len(tokens) > k
    before = served_vs_adapted(model, base_state, None, prompt, tokens[:k])
    after = served_vs_adapted(model, base_state, update, prompt, tokens)[k:]
    assert max(abs(a - b) for a, b in zip(lps, before + after, strict=True)) < 1e-5
    generates = _posts(lora_standin, "/generate")
    assert "lora_path" not in generates[0]  # before any adapter: the base
    name = _posts(lora_standin, "/load_lora_adapter")[-1]["lora_name"]
    assert generates[-1]["lora_path"] == name and generates[-1]["input_ids"] == prompt + tokens[:k]


def test_an_adapter_the_server_cannot_take_is_refused_before_anything_is_sent(
    lora_standin, connect, base_state
):
    engine = connect(lora_standin, max_lora_rank=2, lora_target_modules=["q_proj"])
    with pytest.raises(UsageError, match=r"max_lora_rank >= 4 \(now 2\)"):
        asyncio.run(engine.update_weights(lora_update(base_state, seed=1)))
    with pytest.raises(UsageError, match=r"adapts \['v_proj'\], outside"):
        asyncio.run(engine.update_weights(lora_update(base_state, seed=1, rank=2)))
    assert not _posts(lora_standin, "/load_lora_adapter") and engine.weights_version == 0


def test_a_server_without_lora_fails_the_update_with_the_fix_and_keeps_serving(
    connect, lora_model, base_state
):
    model, tok = lora_model
    backing = HfEngine.from_model(model, tok, HfEngineConfig(max_context=256))
    plain = sglang_standin.SglangStandIn(backing)  # launched without --enable-lora
    try:
        engine = connect(plain)
        with pytest.raises(EngineUnavailable, match="LoRA is not enabled.*--enable-lora"):
            asyncio.run(engine.update_weights(lora_update(base_state, seed=1)))
        assert engine.weights_version == 0
        gen = asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_tokens=2, seed=1)))
        assert len(gen.token_ids) >= 1 and "lora_path" not in _posts(plain, "/generate")[-1]
    finally:
        plain.close()
        asyncio.run(backing.close())


def test_launched_servers_get_sglangs_lora_flags():
    config = SglangEngineConfig(model="m", max_lora_rank=16, max_loras_per_batch=3)
    cmd = launch_command(config, python="py", port=1)
    i = cmd.index("--enable-lora")
    assert cmd[i:] == [
        "--enable-lora",
        "--max-lora-rank",
        "16",
        "--lora-target-modules",
        "all",
        "--max-loras-per-batch",
        "3",
    ]
    named = SglangEngineConfig(model="m", max_lora_rank=8, lora_target_modules=["q_proj", "o_proj"])
    cmd = launch_command(named, python="py", port=1)
    j = cmd.index("--lora-target-modules")
    assert cmd[j : j + 3] == ["--lora-target-modules", "q_proj", "o_proj"]
    assert "--enable-lora" not in launch_command(SglangEngineConfig(model="m"), python="p", port=1)


def test_replicas_share_one_adapter_folder_and_each_names_its_own_adapter(
    lora_standin, lora_model, base_state, tokenizer_dir, tmp_path
):
    from slr_engine_sglang.engine import start_engines

    from slr_testkit import tiny

    model, tok = tiny.tiny_model(seed=3, max_context=256)  # the second server's own model
    backing = HfEngine.from_model(model, tok, HfEngineConfig(max_context=256))
    other = sglang_standin.SglangStandIn(backing, enable_lora=True, max_lora_rank=8)
    servers = [lora_standin, other]
    config = SglangEngineConfig(
        model="m",
        tokenizer=str(tokenizer_dir),
        urls=[s.url for s in servers],
        weights_dir=str(tmp_path / "w"),
        max_lora_rank=8,
    )

    async def scenario():
        engines = await start_engines(config)
        try:
            update = lora_update(base_state, seed=4)
            await asyncio.gather(*(e.update_weights(update) for e in engines))
            prompt, params = [3, 4, 5], SamplingParams(max_tokens=3, seed=1)
            return update, [await e.generate(prompt, params) for e in engines]
        finally:
            await asyncio.gather(*(e.close() for e in engines))

    try:
        update, gens = asyncio.run(scenario())
        loads = [_posts(s, "/load_lora_adapter")[-1] for s in servers]
        assert loads[0]["lora_path"] == loads[1]["lora_path"]  # written once
        assert loads[0]["lora_name"] != loads[1]["lora_name"]
        for gen in gens:  # both servers run the same adapter over the same base
            expected = served_vs_adapted(
                lora_model[0], base_state, update, [3, 4, 5], gen.token_ids
            )
            assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 1e-5
    finally:
        other.close()
        asyncio.run(backing.close())
