"""Hugging Face Hub ids as users write them (``Org/Name``), read from a Hub cache that the
test fills itself in huggingface_hub's layout (blobs, snapshots/<rev>, refs/main): the hf
engine, the torch optimizer and `slr serve Org/Name` all load the same snapshot, offline."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from slr_engine_hf import models

from slr.config import load_config
from slr.contracts import SamplingParams
from slr.errors import UsageError
from slr.plugins import get_plugin_manager
from slr_testkit import tiny

SLR = str(Path(sys.executable).with_name("slr"))
REPO = "Org/Tiny-Coder"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def fill_hub_cache(hub: Path, repo_id: str, model_folder: Path) -> Path:
    """Lay ``model_folder`` out as the Hub cache holds a download: content-addressed blobs,
    a snapshot folder of relative symlinks to them, and refs/main naming the snapshot."""
    root = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = root / "snapshots" / REVISION
    (root / "blobs").mkdir(parents=True)
    for file in sorted(p for p in model_folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = root / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(model_folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Hub cache holding one tiny model under ``REPO``; its snapshot folder."""
    base = tmp_path_factory.mktemp("hub-ids")
    model, tok = tiny.tiny_model(hidden=32, layers=1)
    folder = tiny.save(model, tok, base / "saved")
    snapshot = fill_hub_cache(base / "hub", REPO, folder)
    return base / "hub", snapshot


@pytest.fixture
def hub_env(hub, monkeypatch):
    cache, snapshot = hub
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_hub_id_resolves_to_its_snapshot_in_the_cache_the_environment_names(hub_env):
    assert models.is_hub_id(REPO) and not models.is_hub_id(str(hub_env))
    assert models.resolve(REPO) == hub_env
    assert models.resolve(f"{REPO}@{REVISION}") == hub_env
    with pytest.raises(UsageError, match=r"not in the local Hugging Face Hub cache.*hf download"):
        models.resolve("Org/Not-Downloaded")


@pytest.mark.timeout(120)
def test_engine_and_optimizer_load_the_same_snapshot_from_engine_model(hub_env):
    from slr_optimizer_torch.model import resolve_model_name
    from slr_optimizer_torch.optimizer import TorchOptimizer

    cfg = load_config(
        None,
        plugins=get_plugin_manager(),
        choose={"engine": "hf", "optimizer": "torch"},
        sets=[f'engine.model="{REPO}"'],
    )
    engine = get_plugin_manager().get("engine", "hf").create(cfg.engine.options)
    try:
        gen = asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_tokens=4, temperature=0)))
        assert 1 <= len(gen.token_ids) <= 4
        optimizer = TorchOptimizer.from_config(cfg)
        assert resolve_model_name(REPO) == str(hub_env)
        trained = optimizer.model.state_dict()
        served = engine.model.state_dict()
        assert trained.keys() == served.keys()
        assert all(trained[k].float().equal(served[k].float()) for k in served)
    finally:
        asyncio.run(engine.close())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_slr_serve_takes_a_hub_id_and_answers_the_openai_sdk(hub, tmp_path):
    cache, _ = hub
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [SLR, "serve", REPO, "--engine", "hf", "--set", "rollout.max_tokens=8",
         "--set", f"run.runs_dir={str(tmp_path / 'runs')!r}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(lines)
        token = re.search(r"token (\S+)", text)
        base = re.search(r"openai\s+(\S+)", text)
        assert token and base, text + proc.stderr.read()
        client = openai.OpenAI(base_url=base.group(1), api_key=token.group(1), max_retries=0)
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Hi"}], temperature=0
        )
        assert reply.choices[0].message.role == "assistant"
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
    finally:
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    assert REPO in (tmp_path / "runs").iterdir().__next__().joinpath("config.toml").read_text()
