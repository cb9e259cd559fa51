"""The SGLang stand-in and the engine's requests, checked against SGLang's real schema.

``sglang_schema.py`` is a table of SGLang's request and response fields read from its
source (files and commits cited there). These tests make sure that the stand-in accepts
nothing SGLang would not, answers with nothing SGLang does not send, and that every body
the engine sent in a real exchange uses SGLang's field names.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import sglang_schema as schema
import sglang_standin
import torch
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.server import launch_command

from slr.contracts import SamplingParams

pytestmark = pytest.mark.timeout(120)


def test_the_stand_in_accepts_only_fields_sglang_declares():
    assert sglang_standin.ACCEPTED_GENERATE_FIELDS <= schema.GENERATE_REQUEST_FIELDS
    assert sglang_standin.ACCEPTED_SAMPLING_FIELDS <= schema.SAMPLING_PARAMS_FIELDS
    accepted = {
        sglang_standin.ACCEPTED_INIT_GROUP_FIELDS: schema.INIT_WEIGHTS_UPDATE_GROUP_FIELDS,
        sglang_standin.ACCEPTED_DISTRIBUTED_FIELDS: schema.UPDATE_WEIGHTS_FROM_DISTRIBUTED_FIELDS,
        sglang_standin.ACCEPTED_TENSOR_FIELDS: schema.UPDATE_WEIGHTS_FROM_TENSOR_FIELDS,
        sglang_standin.ACCEPTED_DESTROY_GROUP_FIELDS: schema.DESTROY_WEIGHTS_UPDATE_GROUP_FIELDS,
        sglang_standin.ACCEPTED_LOAD_LORA_FIELDS: schema.LOAD_LORA_ADAPTER_FIELDS,
        sglang_standin.ACCEPTED_UNLOAD_LORA_FIELDS: schema.UNLOAD_LORA_ADAPTER_FIELDS,
        sglang_standin.ACCEPTED_WEIGHT_VERSION_FIELDS: schema.UPDATE_WEIGHT_VERSION_FIELDS,
    }
    for mine, sglangs in accepted.items():
        assert mine <= sglangs, mine - sglangs


def test_a_field_sglang_lacks_is_refused(standin):
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "seed": 1}}
    response = httpx.post(f"{standin.url}/generate", json=body)
    assert response.status_code == 400
    assert "sampling_params.seed" in response.json()["error"]["message"]  # SGLang: sampling_seed


def _check_answer(answer: dict) -> None:
    assert set(answer) <= schema.GENERATE_RESPONSE_KEYS
    meta = answer["meta_info"]
    assert set(meta) <= schema.META_INFO_KEYS, set(meta) - schema.META_INFO_KEYS
    reason = meta["finish_reason"]
    if reason is not None:
        assert set(reason) <= schema.FINISH_REASON_KEYS[reason["type"]]
    for span in meta.get("weight_versions", []):
        assert set(span) == schema.WEIGHT_VERSION_SPAN_KEYS
    for entry in meta.get("output_token_logprobs", []):
        assert len(entry) == 3 and isinstance(entry[1], int)  # [logprob, token_id, text]


def test_the_stand_ins_answers_have_sglangs_shape(standin):
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 1},
        "return_logprob": True,
    }
    answer = httpx.post(f"{standin.url}/generate", json=body, timeout=60).json()
    _check_answer(answer)
    assert answer["meta_info"]["finish_reason"] is not None
    events = []
    with httpx.stream(
        "POST", f"{standin.url}/generate", json={**body, "stream": True}, timeout=60
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    assert events and events[-1]["meta_info"]["finish_reason"] is not None
    for event in events:
        _check_answer(event)
    models = httpx.get(f"{standin.url}/v1/models").json()
    assert all(set(card) <= schema.MODEL_CARD_KEYS for card in models["data"])


def test_every_body_the_engine_sent_uses_sglangs_names(attached, standin, tiny_dense):
    async def exchange():
        params = SamplingParams(max_tokens=3, stop=["\n"], stop_token_ids=[2], seed=4)
        await attached.generate([1, 2, 3], params)
        standin.hold_after = 1  # the next request is mid-generation when its consumer leaves
        stream = attached.stream([1, 2, 3], SamplingParams(max_tokens=50))
        await anext(stream)
        await stream.aclose()  # aborts by rid
        state = {k: v + 0.01 * torch.ones_like(v) for k, v in tiny_dense[0].state_dict().items()}
        await attached.update_weights(state)

    asyncio.run(exchange())
    sent = {r["path"]: r["body"] for r in standin.requests if r["method"] == "POST"}
    assert set(sent) <= {path for method, path in schema.ROUTES if method == "POST"}
    assert {"/generate", "/abort_request", "/update_weights_from_disk"} <= set(sent)
    for r in standin.requests:
        assert (r["method"], r["path"]) in schema.ROUTES, r["path"]
    generate = sent["/generate"]
    assert set(generate) <= schema.GENERATE_REQUEST_FIELDS
    assert set(generate["sampling_params"]) <= schema.SAMPLING_PARAMS_FIELDS
    assert set(sent["/abort_request"]) <= schema.ABORT_REQUEST_FIELDS
    assert set(sent["/update_weights_from_disk"]) <= schema.UPDATE_WEIGHTS_FROM_DISK_FIELDS
    response = httpx.post(f"{standin.url}/update_weights_from_disk", json={"model_path": "/nope"})
    assert set(response.json()) == schema.UPDATE_WEIGHTS_FROM_DISK_RESPONSE_KEYS


def test_a_lora_exchange_uses_sglangs_names_both_ways(lora_standin, attach, lora_model):
    """Two adapter versions (load, version, unload), a generate naming the adapter, and the
    stand-in's refusals: every body and answer is in SGLang's table."""
    from test_sglang_lora import lora_update

    base = {k: v.clone() for k, v in lora_model[0].state_dict().items()}
    engine = attach(lora_standin, max_lora_rank=8)

    async def exchange():
        for seed in (1, 2):
            await engine.update_weights(lora_update(base, seed=seed))
        await engine.generate([1, 2, 3], SamplingParams(max_tokens=2, seed=1))

    asyncio.run(exchange())
    sent: dict[str, list] = {}
    for r in lora_standin.requests:
        assert (r["method"], r["path"]) in schema.ROUTES, r["path"]
        sent.setdefault(r["path"], []).append(r["body"])
    for body in sent["/load_lora_adapter"]:
        assert set(body) <= schema.LOAD_LORA_ADAPTER_FIELDS
    assert sent["/unload_lora_adapter"] and all(
        set(b) <= schema.UNLOAD_LORA_ADAPTER_FIELDS for b in sent["/unload_lora_adapter"]
    )
    for body in sent["/update_weight_version"]:
        assert set(body) <= schema.UPDATE_WEIGHT_VERSION_FIELDS
    assert set(sent["/generate"][-1]) <= schema.GENERATE_REQUEST_FIELDS
    assert sent["/generate"][-1]["lora_path"] == sent["/load_lora_adapter"][-1]["lora_name"]
    answers = [
        httpx.post(f"{lora_standin.url}/load_lora_adapter", json=sent["/load_lora_adapter"][-1]),
        httpx.post(f"{lora_standin.url}/unload_lora_adapter", json={"lora_name": "nope"}),
        httpx.post(
            f"{lora_standin.url}/load_lora_adapter", json={"lora_name": "x", "lora_path": "/"}
        ),
    ]
    for response in answers:  # a name held twice, one never loaded, a folder with no adapter
        assert response.status_code == 400 and not response.json()["success"]
        assert set(response.json()) <= schema.LORA_UPDATE_RESPONSE_KEYS
    version = httpx.post(f"{lora_standin.url}/update_weight_version", json={"new_version": "9"})
    assert set(version.json()) <= schema.UPDATE_WEIGHT_VERSION_RESPONSE_KEYS
    unknown = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}, "lora_path": "nope"}
    refused = httpx.post(f"{lora_standin.url}/generate", json=unknown)
    assert refused.status_code == 400 and "not loaded" in refused.json()["error"]["message"]


def test_the_lora_launch_flags_are_sglangs():
    config = SglangEngineConfig(model="m", max_lora_rank=8, lora_target_modules=["q_proj"])
    cmd = launch_command(config, python="py", port=1)
    flags = {arg for arg in cmd if arg.startswith("--") and "lora" in arg}
    assert flags == schema.LORA_LAUNCH_FLAGS
    modules = cmd[cmd.index("--lora-target-modules") + 1 : cmd.index("--max-loras-per-batch")]
    assert set(modules) <= schema.LORA_TARGET_MODULE_CHOICES
    everything = launch_command(SglangEngineConfig(model="m", max_lora_rank=8), python="p", port=1)
    assert everything[everything.index("--lora-target-modules") + 1] == "all"
