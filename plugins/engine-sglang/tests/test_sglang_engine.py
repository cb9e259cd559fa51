"""slr-engine-sglang against STAND-INS: SGLang needs a GPU, so a local stand-in server
speaks its API (``sglang_standin.py``, checked against SGLang's source in
``test_sglang_schema.py``) with a real tiny model behind it (the hf engine), and a
stand-in ``python`` runs it as ``python -m sglang.launch_server``. What these tests
cannot show (SGLang's own numerics, scheduler, GPU weight loading) is in the README."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import struct
import sys
from pathlib import Path

import pytest
import sglang_standin
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.engine import SglangEngine, create_engine, start_engines
from slr_engine_sglang.protocol import (
    ProtocolError,
    decode_routed_experts,
    distributed_request,
    generate_request,
    read_output,
    server_ranks,
    tensor_request,
)
from slr_engine_sglang.server import launch_command

from slr.contracts import ContextOverflow, Engine, EngineUnavailable, SamplingParams
from slr.engines.balancer import LoadBalancer
from slr.errors import UsageError
from slr.plugins import PluginManager
from slr_testkit import EngineTests, tiny
from slr_testkit.logprobs import reference_logprobs as fp32_reference

pytestmark = pytest.mark.timeout(120)


def reference_logprobs(model, state_dict, prompt, tokens, temperature):
    """The trainer's view: log_softmax(logits / T) of each token from one fp32 forward
    pass over prompt + tokens, under ``state_dict``."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    ref.load_state_dict(state_dict)
    return fp32_reference(ref.eval(), prompt, tokens, temperature)


# -- request building and response parsing ---------------------------------------------


def test_request_body_is_token_in_with_sglangs_names():
    params = SamplingParams(
        temperature=0.7, max_tokens=9, stop=["</tool_call>"], stop_token_ids=[2], seed=5
    )
    body = generate_request([1, 2, 3], params, rid="r1", max_new_tokens=9)
    assert body["input_ids"] == [1, 2, 3] and body["rid"] == "r1"
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    sp = body["sampling_params"]
    assert (sp["temperature"], sp["top_p"], sp["top_k"]) == (0.7, 1.0, -1)
    assert sp["max_new_tokens"] == 9 and sp["sampling_seed"] == 5
    assert sp["stop"] == ["</tool_call>"] and sp["stop_token_ids"] == [2]
    assert sp["no_stop_trim"] is True and sp["skip_special_tokens"] is False
    assert "return_routed_experts" not in body


def _answer(entries, *, completion=None, finish=None, **meta):
    return {
        "text": "",
        "output_ids": [e[1] for e in entries],
        "meta_info": {
            "output_token_logprobs": entries,
            "completion_tokens": len(entries) if completion is None else completion,
            "finish_reason": finish,
            **meta,
        },
    }


def test_weight_group_bodies_and_the_servers_ranks():
    body = distributed_request(
        ["a.weight", "b.bias"],
        ["bfloat16", "float32"],
        [(2, 3), [4]],
        group_name="g",
        weight_version=None,
    )
    assert body == {
        "names": ["a.weight", "b.bias"],
        "dtypes": ["bfloat16", "float32"],
        "shapes": [[2, 3], [4]],
        "group_name": "g",
        "flush_cache": False,
    }
    last = distributed_request(["a"], ["float32"], [[1]], group_name="g", weight_version=4)
    assert (last["weight_version"], last["flush_cache"]) == ("4", True)
    assert tensor_request("xyz", ranks=2, weight_version=None)["serialized_named_tensors"] == [
        "xyz",
        "xyz",
    ]
    assert server_ranks({"tp_size": 4, "dp_size": 1}) == 4
    with pytest.raises(UsageError, match="dp_size=2"):
        server_ranks({"tp_size": 1, "dp_size": 2})


def test_read_output_takes_new_tokens_from_cumulative_and_incremental_events():
    cumulative = _answer([[-0.5, 7, None], [-1.5, 8, None], [-0.1, 9, None]])
    piece = read_output(cumulative, seen=1, prompt_tokens=4)
    assert piece.token_ids == (8, 9) and piece.logprobs == (-1.5, -0.1)
    incremental = _answer([[-1.5, 8, None], [-0.1, 9, None]], completion=3)
    assert read_output(incremental, seen=1, prompt_tokens=4).token_ids == (8, 9)
    done = _answer([[-0.5, 7, None]], finish={"type": "stop", "matched": 7})
    assert read_output(done, seen=0, prompt_tokens=4).finish_reason == "stop"


def test_read_output_uses_the_servers_weight_version_spans():
    data = _answer(
        [[-0.5, 7, None], [-1.5, 8, None], [-0.1, 9, None]],
        weight_versions=[
            {"version": "3", "start": 0, "end": 2},
            {"version": "4", "start": 2, "end": 3},
        ],
    )
    assert read_output(data, seen=0, prompt_tokens=2).versions == (3, 3, 4)
    named = _answer(
        [[-0.5, 7, None]], weight_versions=[{"version": "default", "start": 0, "end": 1}]
    )
    assert read_output(named, seen=0, prompt_tokens=2).versions is None  # not our numbers


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"text": "x"}, "no meta_info"),
        ({"error": {"message": "boom"}}, "boom"),
        ({"meta_info": {"finish_reason": None}}, "no output_token_logprobs"),
        (_answer([[None, 1, None]]), "has no logprob"),
        (_answer([[-1.0, 1, None]], finish={"type": "odd"}), "unknown finish_reason"),
        (_answer([[-1.0, 1, None]], completion=5), "do not fit completion_tokens"),
    ],
)
def test_read_output_rejects_malformed_answers(data, message):
    with pytest.raises(ProtocolError, match=message):
        read_output(data, seen=0, prompt_tokens=1)


def test_routed_experts_decode_from_sglangs_int32_base64():
    rows = [[[1, 2], [3, 0]], [[2, 3], [0, 1]], [[0, 1], [1, 2]]]  # 3 positions, 2 layers, k=2
    flat = [e for row in rows for layer in row for e in layer]
    encoded = base64.b64encode(struct.pack(f"<{len(flat)}i", *flat)).decode()
    assert decode_routed_experts(encoded, rows=3, experts_per_token=2) == rows
    with pytest.raises(ProtocolError, match="experts_per_token"):
        decode_routed_experts(encoded, rows=5, experts_per_token=2)


# -- against the stand-in (a real tiny model behind it) ---------------------------------


def test_generate_returns_the_models_tokens_and_logprobs(attached, standin, tiny_dense):
    model, _ = tiny_dense
    assert isinstance(attached, Engine) and attached.max_context == 256
    prompt = [10, 11, 12, 13]
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=3)
    gen = asyncio.run(attached.generate(prompt, params, session_id="s"))
    assert 1 <= len(gen.token_ids) <= 6 and gen.prompt_tokens == 4
    expected = reference_logprobs(model, model.state_dict(), prompt, gen.token_ids, 0.8)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 1e-4
    sent = [r["body"] for r in standin.requests if r["path"] == "/generate"][-1]
    assert sent["input_ids"] == prompt and sent["sampling_params"]["sampling_seed"] == 3
    assert sent["stream"] is True and sent["rid"].startswith("slr-")


def test_incremental_streaming_servers_give_the_same_generation(standin, attach):
    engine = attach(standin)
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=11)
    cumulative = asyncio.run(engine.generate([5, 6, 7], params))
    standin.incremental = True
    incremental = asyncio.run(engine.generate([5, 6, 7], params))
    assert incremental.token_ids == cumulative.token_ids
    assert incremental.logprobs == pytest.approx(cumulative.logprobs, abs=1e-5)


def test_context_overflow_before_and_from_the_server(attached):
    with pytest.raises(ContextOverflow, match="context is 256"):
        asyncio.run(attached.generate(list(range(256)), SamplingParams()))
    attached._max_context = 1000  # a stale limit: the server's 400 must still map
    with pytest.raises(ContextOverflow) as info:
        asyncio.run(attached.generate(list(range(300)), SamplingParams(max_tokens=1)))
    assert info.value.max_context == 256 and info.value.prompt_tokens == 300


def test_max_new_tokens_is_cut_to_the_room_left(attached, standin):
    gen = asyncio.run(attached.generate([3] * 250, SamplingParams(max_tokens=50, temperature=1.0)))
    assert gen.finish_reason in ("length", "stop") and len(gen.token_ids) <= 5
    sent = [r["body"] for r in standin.requests if r["path"] == "/generate"][-1]
    assert sent["sampling_params"]["max_new_tokens"] == 5  # 256 - 250 - 1: SGLang's limit


def test_server_errors_are_engine_unavailable_and_client_errors_are_not(attached, standin):
    standin.fail_with = 500
    with pytest.raises(EngineUnavailable, match="HTTP 500"):
        asyncio.run(attached.generate([1], SamplingParams(max_tokens=1)))
    standin.fail_with = 400
    with pytest.raises(ValueError, match="HTTP 400"):
        asyncio.run(attached.generate([1], SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="top_k=5"):
        asyncio.run(attached.generate([1], SamplingParams(max_tokens=1, top_k=5)))


def test_unreachable_server_is_engine_unavailable(tokenizer_dir):
    config = SglangEngineConfig(model="m", max_context=64)
    engine = SglangEngine(config, url="http://127.0.0.1:9")
    with pytest.raises(EngineUnavailable, match="did not answer"):
        asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))
    assert asyncio.run(engine.health()) is False


def test_a_stream_closed_early_aborts_its_request_by_rid(attached, standin):
    async def close_early():
        chunks = attached.stream([1, 2, 3], SamplingParams(max_tokens=200, temperature=1.0))
        first = await anext(chunks)
        await chunks.aclose()
        return first

    standin.hold_after = 2  # the server is mid-generation when the consumer leaves
    first = asyncio.run(close_early())
    assert first.token_ids
    rid = [r["body"]["rid"] for r in standin.requests if r["path"] == "/generate"][-1]
    assert {"rid": rid} in [r["body"] for r in standin.requests if r["path"] == "/abort_request"]
    standin.wait_idle()
    assert not standin.running  # the server freed it


def _perturbed(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


def test_drain_update_loads_a_weights_folder_and_bumps_the_version(attached, standin, tiny_dense):
    model, _ = tiny_dense
    new = _perturbed(model)
    assert asyncio.run(attached.update_weights(new)) == 1 == attached.weights_version
    load = [r["body"] for r in standin.requests if r["path"] == "/update_weights_from_disk"][-1]
    assert load["weight_version"] == "1"
    assert (Path(load["model_path"]) / "model.safetensors").is_file()
    prompt = [4, 5, 6]
    gen = asyncio.run(attached.generate(prompt, SamplingParams(max_tokens=4, seed=2)))
    assert set(gen.weights_versions) == {1}
    expected = reference_logprobs(model, new, prompt, gen.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 1e-4


def test_partial_update_aborts_at_a_token_and_resumes_under_the_new_weights(
    attached, standin, tiny_dense
):
    model, _ = tiny_dense
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = _perturbed(model)
    prompt = [7, 8, 9, 10]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5)

    async def run():
        chunks = []
        stream = attached.stream(prompt, params)
        chunks.append(await anext(stream))
        update = asyncio.ensure_future(attached.update_weights(new, mode="partial"))
        async for chunk in stream:
            chunks.append(chunk)
        return chunks, await update

    standin.hold_after = 3  # the first request is still generating when the update comes
    chunks, version = asyncio.run(run())
    assert version == 1
    tokens = [t for c in chunks for t in c.token_ids]
    lps = [lp for c in chunks for lp in c.logprobs]
    versions = [v for c in chunks for v in c.weights_versions]
    assert chunks[-1].finish_reason in ("stop", "length")
    k = versions.count(0)  # the token boundary the abort reached (at most the 3 held)
    assert 1 <= k <= 3 and versions == [0] * k + [1] * (len(tokens) - k) and len(tokens) > k
    assert len(tokens) <= 12
    # each token's log-prob is that of the weights that sampled it, over everything before
    before = reference_logprobs(model, old, prompt, tokens[:k], 1.0)
    after = reference_logprobs(model, new, prompt, tokens, 1.0)[k:]
    assert max(abs(a - b) for a, b in zip(lps, before + after, strict=True)) < 1e-4
    generates = [r["body"] for r in standin.requests if r["path"] == "/generate"]
    assert generates[-1]["input_ids"] == prompt + tokens[:k]  # resumed with its tokens so far
    assert generates[-1]["sampling_params"]["max_new_tokens"] == 12 - k


def test_weight_updates_can_be_switched_off(standin, attach):
    engine = attach(standin, weight_update="none")
    with pytest.raises(UsageError, match="weight_update = 'none'"):
        asyncio.run(engine.update_weights({}))


def test_routed_experts_come_back_per_token_from_a_moe_model(tokenizer_dir, attach):
    moe, tok = tiny.tiny_model("qwen3_moe", seed=0, max_context=256)
    backing = HfEngine.from_model(moe, tok, HfEngineConfig(return_routed_experts=True))
    server = sglang_standin.SglangStandIn(backing, routed_experts=True)
    try:
        engine = attach(server, return_routed_experts=True, experts_per_token=2)
        params = SamplingParams(max_tokens=4, temperature=1.0, seed=9)
        gen = asyncio.run(engine.generate([1, 2, 3], params))
        direct = asyncio.run(backing.generate([1, 2, 3], params))
        assert gen.token_ids == direct.token_ids
        assert len(gen.routed_experts) == 3 + len(gen.token_ids) - 1
        assert gen.routed_experts == direct.routed_experts
        body = [r["body"] for r in server.requests if r["path"] == "/generate"][-1]
        assert body["return_routed_experts"] is True
    finally:
        server.close()
        asyncio.run(backing.close())
    config = SglangEngineConfig(model="m", return_routed_experts=True)
    assert "--enable-return-routed-experts" in launch_command(config, python="py", port=1)


def test_flush_cache_is_refused_while_requests_run(attached, standin):
    assert asyncio.run(attached.flush_cache()) is True
    assert [r["path"] for r in standin.requests][-1] == "/flush_cache"


class TestSglangEngineConformanceAgainstStandIn(EngineTests):
    """The shared contract checks, with real tokens from the tiny model behind the stand-in."""

    @pytest.fixture
    def engine(self, attached):
        return attached


# -- launching servers with the stand-in executable --------------------------------------


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """A `python` that runs the stand-in server for `-m sglang.launch_server ...`."""
    exe = tmp_path / "bin" / "python-with-sglang"
    exe.parent.mkdir()
    standin_file = Path(sglang_standin.__file__).resolve()
    exe.write_text(
        f'#!/bin/sh\n# stand-in for SGLang (tests only)\nexec {sys.executable} {standin_file} "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record.json"
    monkeypatch.setenv("SGLANG_STANDIN_RECORD", str(record))
    return exe, record


@pytest.mark.slow
def test_launches_sglang_and_stops_its_process_group(fake_python, tmp_path, tiny_dense):
    exe, record = fake_python
    folder = tiny.save(*tiny_dense, tmp_path / "model")
    config = SglangEngineConfig(
        model=str(folder),
        python=str(exe),
        max_context=128,
        gpus_per_replica=["3"],
        extra_args=["--tp-size", "1"],
        log_dir=str(tmp_path / "logs"),
        startup_timeout_s=120,
    )
    engine = asyncio.run(start_engines(config))[0]
    try:
        argv = json.loads(record.read_text())["argv"]
        assert argv[:4] == ["-m", "sglang.launch_server", "--model-path", str(folder)]
        assert argv[argv.index("--context-length") + 1] == "128"
        assert argv[argv.index("--served-model-name") + 1] == "slr-policy"
        assert argv[-2:] == ["--tp-size", "1"]
        assert json.loads(record.read_text())["env"] == {"CUDA_VISIBLE_DEVICES": "3"}
        assert engine.max_context == 128
        gen = asyncio.run(engine.generate([3, 4], SamplingParams(max_tokens=3)))
        assert 1 <= len(gen.token_ids) <= 3
        assert asyncio.run(engine.health()) is True
    finally:
        asyncio.run(engine.close())
    assert engine.server is not None and engine.server.process.returncode is not None
    assert asyncio.run(engine.health()) is False


def test_a_server_that_dies_at_startup_is_reported_with_its_log(
    fake_python, tmp_path, tokenizer_dir, monkeypatch
):
    exe, _ = fake_python
    monkeypatch.setenv("SGLANG_STANDIN_CRASH", "1")
    config = SglangEngineConfig(
        model="m", tokenizer=str(tokenizer_dir), python=str(exe), log_dir=str(tmp_path)
    )
    with pytest.raises(EngineUnavailable, match="CUDA out of memory") as info:
        asyncio.run(start_engines(config))
    assert "exited with code 3" in str(info.value)


def test_missing_python_is_a_usage_error(tokenizer_dir, monkeypatch):
    monkeypatch.setenv("PATH", "")
    config = SglangEngineConfig(model="m", tokenizer=str(tokenizer_dir), python="python")
    with pytest.raises(UsageError, match="not on PATH"):
        asyncio.run(start_engines(config))


def test_registered_factory_builds_a_balancer_over_attached_servers(backing, tokenizer_dir):
    servers = [sglang_standin.SglangStandIn(backing) for _ in range(2)]
    registration = PluginManager().get("engine", "sglang")
    assert registration.plugin.distribution == "slr-engine-sglang"
    config = SglangEngineConfig(
        model="m", tokenizer=str(tokenizer_dir), urls=[s.url for s in servers]
    )
    engine = registration.create(config)
    try:
        assert isinstance(engine, LoadBalancer)

        async def four_sessions():
            return await asyncio.gather(
                *(
                    engine.generate([1, 2], SamplingParams(max_tokens=2), session_id=f"s{i}")
                    for i in range(4)
                )
            )

        assert all(1 <= len(g.token_ids) <= 2 for g in asyncio.run(four_sessions()))
        assert sorted(r["sessions"] for r in engine.metrics()["replicas"].values()) == [2, 2]
    finally:
        asyncio.run(engine.close())
        for s in servers:
            s.close()
    assert create_engine is registration.load()


def test_one_weights_folder_serves_every_replica(backing, tokenizer_dir, tmp_path, tiny_dense):
    servers = [sglang_standin.SglangStandIn(backing) for _ in range(2)]
    config = SglangEngineConfig(
        model="m",
        tokenizer=str(tokenizer_dir),
        urls=[s.url for s in servers],
        weights_dir=str(tmp_path / "w"),
        keep_weight_versions=1,
    )
    engine = create_engine(config)
    try:
        state = _perturbed(tiny_dense[0])
        assert asyncio.run(engine.update_weights(state)) == 1
        assert asyncio.run(engine.update_weights(state, version=2)) == 2
        loads = [
            r["body"]["model_path"]
            for s in servers
            for r in s.requests
            if r["path"] == "/update_weights_from_disk"
        ]
        assert len(loads) == 4 and len(set(loads)) == 2  # written once per version
        assert [p.name for p in Path(loads[-1]).parent.iterdir()] == ["v000002"]  # kept 1
    finally:
        asyncio.run(engine.close())
        for s in servers:
            s.close()
    assert os.path.isdir(tmp_path / "w")
