"""Fixtures: SGLang stand-ins backed by a real (tiny) model through the hf engine."""

from __future__ import annotations

import asyncio

import pytest
import sglang_standin
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.engine import SglangEngine

from slr_testkit import tiny


@pytest.fixture(scope="session")
def tiny_dense():
    """A tiny random Qwen2 and the SmolLM2 tokenizer (built in about a second)."""
    return tiny.tiny_model(seed=0, max_context=256)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, tiny_dense):
    folder = tmp_path_factory.mktemp("tok")
    tiny_dense[1].save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def _backing_engine(tiny_dense):
    model, tok = tiny_dense
    engine = HfEngine.from_model(model, tok, HfEngineConfig(max_context=256))
    yield engine
    asyncio.run(engine.close())


@pytest.fixture
def backing(_backing_engine, tiny_dense):
    """The hf engine that samples for the stand-in, with the tiny model's own weights (a
    test that updates them gets them restored afterwards)."""
    model, _ = tiny_dense
    original = {k: v.clone() for k, v in model.state_dict().items()}
    version = _backing_engine.weights_version
    yield _backing_engine
    if _backing_engine.weights_version != version:
        asyncio.run(_backing_engine.update_weights(original))


@pytest.fixture
def standin(backing):
    server = sglang_standin.SglangStandIn(backing)
    yield server
    server.close()


@pytest.fixture
def lora_model():
    """A tiny model (and tokenizer) of the test's own: serving LoRA puts peft's layers into
    the model, which must not leak into the shared one."""
    return tiny.tiny_model(seed=3, max_context=256)


@pytest.fixture
def lora_standin(lora_model):
    """A stand-in launched as with ``--enable-lora --max-lora-rank 8`` on ``lora_model``."""
    model, tok = lora_model
    engine = HfEngine.from_model(model, tok, HfEngineConfig(max_context=256))
    server = sglang_standin.SglangStandIn(engine, enable_lora=True, max_lora_rank=8)
    yield server
    server.close()
    asyncio.run(engine.close())


@pytest.fixture
def attach(tokenizer_dir, tmp_path, tiny_dense):
    """``attach(standin, **options)``: a started SglangEngine on that stand-in."""
    engines: list[SglangEngine] = []

    def make(server, **options) -> SglangEngine:
        options.setdefault("weights_dir", str(tmp_path / "weights"))
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


@pytest.fixture
def attached(standin, attach):
    return attach(standin)
