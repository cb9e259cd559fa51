"""slr-engine-vllm against STAND-INS: vLLM needs a GPU, so a local stand-in server speaks
its API (``vllm_standin.py``) and a stand-in ``vllm`` executable launches that server.
What these tests cannot show (real vLLM numerics, NCCL) is listed in the plugin README."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
import vllm_standin
from slr_engine_vllm.config import VllmEngineConfig
from slr_engine_vllm.engine import VllmEngine, create_engine, start_engines
from slr_engine_vllm.protocol import ProtocolError, completion_request, parse_completion
from slr_engine_vllm.server import serve_command
from slr_engine_vllm.weights import WeightSync

from slr.contracts import ContextOverflow, Engine, EngineUnavailable, SamplingParams
from slr.errors import UsageError


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from slr_testkit import tiny

    folder = tmp_path_factory.mktemp("tok")
    tiny.tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def standin():
    state = vllm_standin.StandInState()
    server, url = vllm_standin.start(state)
    yield state, url
    server.shutdown()
    server.server_close()


@pytest.fixture
def attached(standin, tokenizer_dir):
    state, url = standin
    config = VllmEngineConfig(model="m", tokenizer=str(tokenizer_dir), urls=[url])
    engine = VllmEngine(config, url=url)
    asyncio.run(engine.start())
    yield engine, state
    asyncio.run(engine.close())


# -- request building and response parsing ---------------------------------------------


def test_request_body_is_token_in_with_vllm_extensions():
    params = SamplingParams(
        temperature=0.7, max_tokens=9, stop=["</tool_call>"], stop_token_ids=[2], seed=5
    )
    body = completion_request([1, 2, 3], params, model="slr-policy")
    assert body["prompt"] == [1, 2, 3]
    assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert body["return_token_ids"] is True and body["skip_special_tokens"] is False
    assert body["include_stop_str_in_output"] is True
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 1.0, -1)
    assert body["stop"] == ["</tool_call>"] and body["stop_token_ids"] == [2]
    assert body["seed"] == 5 and body["max_tokens"] == 9
    assert "return_routed_experts" not in body


def test_truncated_sampling_is_refused_unless_allowed():
    with pytest.raises(ValueError, match="renormalized over the kept tokens"):
        completion_request([1], SamplingParams(top_k=20), model="m")
    body = completion_request(
        [1], SamplingParams(top_k=20, top_p=0.9), model="m", allow_truncated_logprobs=True
    )
    assert body["top_k"] == 20 and body["top_p"] == 0.9


def test_parse_reads_token_id_strings_when_ids_are_not_listed():
    data = {
        "choices": [
            {
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:0"],
                    "token_logprobs": [-1.5, -0.5],
                },
                "finish_reason": "stop",
            }
        ]
    }
    gen = parse_completion(data, prompt_tokens=3, weights_version=2)
    assert gen.token_ids == (7, 0) and gen.logprobs == (-1.5, -0.5)
    assert (gen.finish_reason, gen.weights_version, gen.prompt_tokens) == ("stop", 2, 3)


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ({"finish_reason": "stop"}, "no per-token logprobs"),
        (
            {"logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}, "finish_reason": "stop"},
            "return_tokens_as_token_ids",
        ),
        (
            {
                "logprobs": {"tokens": ["token_id:1"], "token_logprobs": [None]},
                "finish_reason": "stop",
            },
            "has no logprob",
        ),
        (
            {
                "logprobs": {"tokens": ["token_id:1"], "token_logprobs": [-1.0]},
                "finish_reason": "odd",
            },
            "unknown finish_reason",
        ),
        (
            {
                "token_ids": [1, 2],
                "logprobs": {"tokens": ["token_id:1"], "token_logprobs": [-1.0]},
                "finish_reason": "stop",
            },
            "2 token ids but 1 logprobs",
        ),
    ],
)
def test_parse_rejects_malformed_responses(choice, message):
    with pytest.raises(ProtocolError, match=message):
        parse_completion({"choices": [choice]}, prompt_tokens=1, weights_version=0)


# -- against the stand-in server ---------------------------------------------------------


def test_generate_round_trip(attached):
    engine, state = attached
    assert isinstance(engine, Engine) and engine.max_context == 64
    gen = asyncio.run(
        engine.generate([10, 11], SamplingParams(max_tokens=4, stop_token_ids=[14]), session_id="s")
    )
    assert gen.token_ids == (12, 13, 14) and gen.finish_reason == "stop"
    assert gen.logprobs == (-0.25, -0.5, -0.75)
    sent = [r for r in state.requests if r["path"] == "/v1/completions"][-1]
    assert sent["body"]["prompt"] == [10, 11]
    assert sent["headers"].get("X-Session-Id") == "s"


def test_older_servers_without_token_ids_still_parse(attached):
    engine, state = attached
    state.return_token_ids = False
    gen = asyncio.run(engine.generate([20], SamplingParams(max_tokens=2)))
    assert gen.token_ids == (21, 22) and gen.finish_reason == "length"


def test_context_overflow_before_and_from_the_server(attached):
    engine, _ = attached
    with pytest.raises(ContextOverflow, match="context is 64"):
        asyncio.run(engine.generate(list(range(64)), SamplingParams()))
    engine._max_context = 1000  # a stale limit: the server's 400 must still map
    with pytest.raises(ContextOverflow) as info:
        asyncio.run(engine.generate(list(range(100)), SamplingParams()))
    assert info.value.max_context == 64 and info.value.prompt_tokens == 100


def test_server_errors_are_engine_unavailable_and_client_errors_are_not(attached):
    engine, state = attached
    state.fail_with = 500
    with pytest.raises(EngineUnavailable, match="HTTP 500"):
        asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))
    state.fail_with = None
    state.garble = True
    with pytest.raises(EngineUnavailable, match="no per-token logprobs"):
        asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))
    state.garble = False
    engine.config = VllmEngineConfig(model="m", served_model_name="other")
    with pytest.raises(ValueError, match="HTTP 404"):
        asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))


def test_unreachable_server_is_engine_unavailable():
    engine = VllmEngine(VllmEngineConfig(model="m", max_context=64), url="http://127.0.0.1:9")
    with pytest.raises(EngineUnavailable, match="did not answer"):
        asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))
    assert asyncio.run(engine.health()) is False


def test_routed_experts_are_read_from_vllms_base64_npy(standin):
    state, url = standin
    state.routed_experts = True  # the server was launched with --enable-return-routed-experts
    config = VllmEngineConfig(model="m", return_routed_experts=True, max_context=64)
    engine = VllmEngine(config, url=url, tokenizer=object())
    gen = asyncio.run(engine.generate([5], SamplingParams(max_tokens=2)))
    assert gen.token_ids == (6, 7)
    # tokens 5 and 6: all fed but the last, as one compact array
    assert gen.routed_experts is not None and gen.routed_experts.tolist() == [[[1, 2]], [[2, 3]]]
    sent = [r["body"] for r in state.requests if r["path"] == "/v1/completions"][-1]
    assert "return_routed_experts" not in sent  # not a request field: the server flag decides

    # vLLM streams no routing: with capture on, the stream is the whole completion at once
    async def streamed():
        return [c async for c in engine.stream([5], SamplingParams(max_tokens=2))]

    chunks = asyncio.run(streamed())
    assert len(chunks) == 1 and chunks[0].routed_experts == gen.routed_experts
    assert not state.requests[-1]["body"].get("stream")
    assert "--enable-return-routed-experts" in serve_command(
        config, executable="vllm", port=1, max_context=0
    )


class RecordingTransportStandIn:
    """Stands in for the NCCL data plane (needs vllm + a GPU): records what it was given."""

    def __init__(self):
        self.calls = []

    def init(self, init_info):
        self.calls.append(("init", init_info))

    def send(self, state_dict):
        self.calls.append(("send", list(state_dict)))


def test_weight_update_runs_vllms_control_sequence(standin):
    state, url = standin
    state.world_size = 2
    transport = RecordingTransportStandIn()
    engine = VllmEngine(
        VllmEngineConfig(model="m", max_context=64, trainer_address="127.0.0.1"),
        url=url,
        tokenizer=object(),
        transport=transport,
    )
    weights = {"a.weight": torch.zeros(2, 3), "b.bias": torch.ones(4, dtype=torch.bfloat16)}
    assert asyncio.run(engine.update_weights(weights)) == 1
    assert asyncio.run(engine.update_weights(weights, version=5)) == 5
    gen = asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))
    assert gen.weights_version == 5 == engine.weights_version
    control = [r["path"] for r in state.requests if r["path"] != "/v1/completions"]
    assert control == [
        "/get_world_size",
        "/init_weight_transfer_engine",
        "/pause",
        "/update_weights",
        "/resume",
        "/pause",
        "/update_weights",
        "/resume",
    ]
    init = next(r for r in state.requests if r["path"] == "/init_weight_transfer_engine")
    assert init["body"]["init_info"]["world_size"] == 3
    assert init["body"]["init_info"]["rank_offset"] == 1
    assert transport.calls[0] == ("init", init["body"]["init_info"])
    update = next(r for r in state.requests if r["path"] == "/update_weights")
    assert update["body"]["update_info"] == {
        "names": ["a.weight", "b.bias"],
        "dtype_names": ["float32", "bfloat16"],
        "shapes": [[2, 3], [4]],
        "packed": True,
    }
    pause = next(r for r in state.requests if r["path"] == "/pause")
    assert pause["query"]["mode"] == ["wait"]


def test_weight_updates_can_be_switched_off(standin):
    _, url = standin
    engine = VllmEngine(
        VllmEngineConfig(model="m", max_context=64, weight_transfer="none"), url=url
    )
    with pytest.raises(UsageError, match="weight_transfer = 'none'"):
        asyncio.run(engine.update_weights({}))
    # the default data plane is vLLM's NCCL engine, imported only when first used
    assert type(WeightSync().transport).__name__ == "NcclTransport"


# -- launching servers with the stand-in executable --------------------------------------


@pytest.fixture
def fake_vllm_on_path(tmp_path, monkeypatch):
    """A `vllm` executable on PATH that runs the stand-in server (vllm_standin.py)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "vllm"
    standin_file = Path(vllm_standin.__file__).resolve()
    exe.write_text(
        f'#!/bin/sh\n# stand-in for vLLM (tests only)\nexec {sys.executable} {standin_file} "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("VLLM_STANDIN_RECORD", str(record))
    return record


def test_launches_vllm_serve_and_stops_its_process_group(
    fake_vllm_on_path, tmp_path, tokenizer_dir, monkeypatch
):
    monkeypatch.setenv("VLLM_STANDIN_CHILD", "1")
    config = VllmEngineConfig(
        model="some/model",
        tokenizer=str(tokenizer_dir),
        max_context=48,
        gpus_per_replica=["3"],
        extra_args=["--tensor-parallel-size", "1"],
        log_dir=str(tmp_path / "logs"),
        startup_timeout_s=120,
    )
    engines = asyncio.run(start_engines(config))
    engine = engines[0]
    try:
        record = json.loads(fake_vllm_on_path.read_text())
        argv = record["argv"]
        assert argv[:2] == ["serve", "some/model"]
        assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
        assert argv[argv.index("--max-model-len") + 1] == "48"
        assert argv[argv.index("--served-model-name") + 1] == "slr-policy"
        assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
        assert argv[-2:] == ["--tensor-parallel-size", "1"]
        assert record["env"] == {"VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "3"}
        assert engine.max_context == 48
        gen = asyncio.run(engine.generate([3, 4], SamplingParams(max_tokens=3)))
        assert gen.token_ids == (5, 6, 7)
        assert asyncio.run(engine.health()) is True
        child = int(Path(str(fake_vllm_on_path) + ".child").read_text())
        assert _alive(child)
    finally:
        asyncio.run(engine.close())
    assert engine.server.process.returncode is not None
    assert not _alive(child)  # the server's worker went with its process group
    assert asyncio.run(engine.health()) is False


def test_routing_capture_launches_vllms_v2_model_runner(fake_vllm_on_path, tokenizer_dir):
    """vLLM 0.32 returns routed experts only from its V2 model runner (its config check says
    so, and that runner needs Triton: a GPU); a launched server gets both switches."""
    config = VllmEngineConfig(
        model="m", tokenizer=str(tokenizer_dir), max_context=32, return_routed_experts=True
    )
    engine = asyncio.run(start_engines(config))[0]
    try:
        record = json.loads(fake_vllm_on_path.read_text())
        assert "--enable-return-routed-experts" in record["argv"]
        assert record["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    finally:
        asyncio.run(engine.close())


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def test_a_server_that_dies_at_startup_is_reported_with_its_log(
    fake_vllm_on_path, tmp_path, tokenizer_dir, monkeypatch
):
    monkeypatch.setenv("VLLM_STANDIN_CRASH", "1")
    config = VllmEngineConfig(model="m", tokenizer=str(tokenizer_dir), log_dir=str(tmp_path))
    with pytest.raises(EngineUnavailable, match="CUDA out of memory") as info:
        asyncio.run(start_engines(config))
    assert "exited with code 3" in str(info.value)


def test_missing_executable_is_a_usage_error(tokenizer_dir, monkeypatch):
    monkeypatch.setenv("PATH", "")
    config = VllmEngineConfig(model="m", tokenizer=str(tokenizer_dir))
    with pytest.raises(UsageError, match="not on PATH"):
        asyncio.run(start_engines(config))


def test_factory_works_inside_a_running_event_loop(fake_vllm_on_path, tokenizer_dir):
    config = VllmEngineConfig(model="m", tokenizer=str(tokenizer_dir), max_context=32)

    async def inside():
        engine = create_engine(config)  # e.g. built by code already running in asyncio
        try:
            return await engine.generate([7], SamplingParams(max_tokens=1))
        finally:
            await engine.close()

    assert asyncio.run(inside()).token_ids == (8,)


def test_stream_errors_are_the_generate_errors(attached):
    engine, state = attached

    async def consume(prompt):
        return [c async for c in engine.stream(prompt, SamplingParams(max_tokens=2))]

    state.fail_with = 503
    with pytest.raises(EngineUnavailable):
        asyncio.run(consume([1, 2]))
    state.fail_with = None
    state.max_model_len = 8
    engine._max_context = 0  # let the server judge the length, as an attached one would
    with pytest.raises(ContextOverflow):
        asyncio.run(consume(list(range(8))))


def test_a_partial_update_with_routed_experts_is_refused_by_name(standin, tokenizer_dir):
    """vLLM returns routing only with a whole completion: no token boundary to pause at."""
    config = VllmEngineConfig(
        model="m", tokenizer=str(tokenizer_dir), max_context=64, return_routed_experts=True
    )
    engine = VllmEngine(config, url=standin[1])
    with pytest.raises(NotImplementedError, match="return_routed_experts"):
        asyncio.run(engine.update_weights({}, mode="partial"))


def test_many_generations_in_one_event_loop_never_exhaust_the_connection_pool(attached):
    """The proxy serves every call from one event loop, so the engine's HTTP client lives
    on. A finished stream must give its connection back: cancelling the request's reader
    while it closed the response leaked one from httpx's pool (100 connections), and the
    101st call waited forever (a training run's third step did)."""
    engine, _ = attached

    async def many() -> int:
        done = 0
        for i in range(130):
            gen = await asyncio.wait_for(engine.generate([i + 1], SamplingParams(max_tokens=2)), 10)
            done += gen.finish_reason == "length"
        return done

    assert asyncio.run(many()) == 130
