"""The vLLM stand-in and the engine's requests, checked against vLLM's real schema.

``vllm_schema.py`` is a table of vLLM's completions fields read from its source (file and
commit cited there). vLLM ignores request fields it does not know, so a misspelt one would
never fail against a real server: these checks are where it fails.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import vllm_schema as schema
import vllm_standin
from slr_engine_vllm.config import VllmEngineConfig
from slr_engine_vllm.engine import VllmEngine
from slr_engine_vllm.protocol import completion_request

from slr.contracts import SamplingParams

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def standin():
    state = vllm_standin.StandInState()
    server, url = vllm_standin.start(state)
    yield state, url
    server.shutdown()
    server.server_close()


def test_the_engines_request_uses_only_vllms_fields():
    params = SamplingParams(
        temperature=0.7, top_k=5, top_p=0.9, max_tokens=9, stop=["x"], stop_token_ids=[2], seed=5
    )
    body = completion_request([1, 2], params, model="m", allow_truncated_logprobs=True)
    assert set(body) <= schema.COMPLETION_REQUEST_FIELDS, (
        set(body) - schema.COMPLETION_REQUEST_FIELDS
    )


def test_the_stand_ins_answers_have_vllms_shape(standin):
    state, url = standin
    state.routed_experts = True
    body = completion_request([3, 4], SamplingParams(max_tokens=3), model=state.served_model_name)
    answer = httpx.post(f"{url}/v1/completions", json=body).json()
    assert set(answer) <= schema.RESPONSE_KEYS
    choice = answer["choices"][0]
    assert set(choice) <= schema.CHOICE_KEYS
    assert set(choice["logprobs"]) <= schema.LOGPROBS_KEYS
    assert isinstance(choice["routed_experts"], str)  # base64 .npy, as vLLM sends it
    chunks = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append(json.loads(line[5:]))
    assert chunks
    for chunk in chunks:
        assert set(chunk) <= schema.STREAM_RESPONSE_KEYS
        assert set(chunk["choices"][0]) <= schema.STREAM_CHOICE_KEYS


def test_every_body_the_engine_sent_uses_vllms_names(standin, tmp_path):
    state, url = standin
    config = VllmEngineConfig(model="m", max_context=64, return_routed_experts=True)
    engine = VllmEngine(config, url=url, tokenizer=object())

    async def exchange():
        await engine.generate([1, 2], SamplingParams(max_tokens=2, seed=1, stop_token_ids=[9]))
        return [c async for c in engine.stream([1, 2], SamplingParams(max_tokens=2))]

    asyncio.run(exchange())
    for r in state.requests:
        if r["path"] == "/v1/completions":
            assert set(r["body"]) <= schema.COMPLETION_REQUEST_FIELDS
