"""The packaged model cache: converted once, safely under concurrency, then reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from slr_engine_hf import models
from slr_engine_hf.cli import models as models_cli

from slr.errors import UsageError


@pytest.mark.slow
def test_two_processes_converting_at_once_share_one_result(tmp_path):
    """Both start with an empty cache; one converts under the lock, the other waits and
    reuses the folder. No partial folder is ever visible."""
    env = {**os.environ, "SLR_CACHE_DIR": str(tmp_path)}
    code = (
        "from slr_engine_hf.models import ensure_model;"
        "print('RESULT', ensure_model('smollm2-135m-instruct', progress=False))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    results = {
        line.split(" ", 1)[1]
        for out in outputs
        for line in out.splitlines()
        if line.startswith("RESULT ")
    }
    target = tmp_path / "models" / "smollm2-135m-instruct"
    assert results == {str(target)}
    assert sum(out.count("converting model once") for out in outputs) == 1
    files = sorted(p.name for p in target.iterdir())
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
        "slr-model.json",
    ):
        assert name in files
    assert json.loads((target / "slr-model.json").read_text())["format"] == models._FORMAT
    # The special tokens are the GGUF file's own (transformers 5.10 reads its eos as
    # <|im_start|>): generation stops at <|im_end|>, id 2, in every file a loader reads.
    _assert_smollm2_special_tokens(target)
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]
    assert leftovers == []
    # a third call finds it done and returns at once
    start = time.monotonic()
    env_before = os.environ.get("SLR_CACHE_DIR")
    os.environ["SLR_CACHE_DIR"] = str(tmp_path)
    try:
        assert models.ensure_model("smollm2-135m-instruct") == target
    finally:
        if env_before is None:
            del os.environ["SLR_CACHE_DIR"]
        else:
            os.environ["SLR_CACHE_DIR"] = env_before
    assert time.monotonic() - start < 5


def _assert_smollm2_special_tokens(folder):
    from transformers import AutoTokenizer

    from slr.proxy.render import Renderer
    from slr.proxy.toolparse import HermesParser

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    for name in ("config.json", "generation_config.json"):
        assert json.loads((folder / name).read_text())["eos_token_id"] == 2, name
    assert Renderer(tokenizer, HermesParser()).stop_token_ids == frozenset({2})


@pytest.mark.slow
def test_a_tokenizer_alone_converts_by_the_same_rules(tmp_path, monkeypatch):
    """Tests that need only the tokenizer get it without converting the weights, and with
    the same special tokens (this path once wrote transformers' wrong eos unchecked)."""
    from transformers import AutoTokenizer

    from slr_testkit.tiny import tokenizer

    monkeypatch.setenv("SLR_CACHE_DIR", str(tmp_path))
    folder = models.ensure_tokenizer("smollm2-135m-instruct")
    assert folder == tmp_path / "models" / "smollm2-135m-instruct-tokenizer"
    assert not (folder / "model.safetensors").exists()
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer().eos_token_id == 2
    # a tampered folder is made again, not trusted
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**config, "eos_token": "<|im_start|>"})
    )
    assert models.ensure_tokenizer("smollm2-135m-instruct") == folder
    assert AutoTokenizer.from_pretrained(folder).eos_token == "<|im_end|>"


def test_the_gguf_metadata_names_the_special_tokens_and_template():
    special, template = models.gguf_special_tokens(models.packaged_gguf("smollm2-135m-instruct"))
    assert special.eos == (2, "<|im_end|>")
    assert special.bos == (1, "<|im_start|>")
    assert template is not None and "<|im_end|>" in template


def _fake_folder(folder, *, eos_text="<|im_end|>", eos_id=2, gen_eos=2):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos_id}))
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": gen_eos})
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": eos_text})
    )
    special = {"bos": [1, "<|im_start|>"], "eos": [2, "<|im_end|>"], "pad": None}
    (folder / "slr-model.json").write_text(
        json.dumps({"format": models._FORMAT, "special_tokens": special})
    )
    return folder


def test_a_cached_folder_that_disagrees_with_its_record_is_converted_again(tmp_path):
    assert models._is_complete(_fake_folder(tmp_path / "good"))
    # what transformers 5.10 wrote: eos <|im_start|> in the tokenizer's config
    assert not models._is_complete(_fake_folder(tmp_path / "bad-text", eos_text="<|im_start|>"))
    assert not models._is_complete(_fake_folder(tmp_path / "bad-id", eos_id=1, gen_eos=1))
    with pytest.raises(ValueError, match="eos token id differs"):
        models.folder_special_tokens(_fake_folder(tmp_path / "split", gen_eos=1))
    old = _fake_folder(tmp_path / "format-1")
    (old / "slr-model.json").write_text(json.dumps({"format": 1}))
    assert not models._is_complete(old)


def test_a_tokenizer_with_the_wrong_eos_is_rejected(smol_tokenizer_copy):
    special = models.SpecialTokens(bos=(1, "<|im_start|>"), eos=(2, "<|im_end|>"), pad=None)
    models.check_special_tokens(smol_tokenizer_copy, special, source="test")
    smol_tokenizer_copy.eos_token = "<|im_start|>"
    with pytest.raises(models.ConversionError, match=r"eos token is '<\|im_start\|>' \(id 1\)"):
        models.check_special_tokens(smol_tokenizer_copy, special, source="test")
    smol_tokenizer_copy.eos_token = "<|im_end|>"
    smol_tokenizer_copy.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(models.ConversionError, match="chat template ends an assistant turn"):
        models.check_special_tokens(smol_tokenizer_copy, special, source="test")


@pytest.fixture
def smol_tokenizer_copy():
    """A fresh copy of the converted SmolLM2 tokenizer, free to be changed."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.ensure_model("smollm2-135m-instruct"))


def test_resolve_explains_what_it_accepts(tmp_path):
    with pytest.raises(UsageError, match="neither a packaged model"):
        models.resolve(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no config.json"):
        models.resolve(str(tmp_path / "empty"))


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SLR_CACHE_DIR", str(tmp_path))
    assert models.cache_dir() == tmp_path
    result = CliRunner().invoke(models_cli, ["path"])
    assert result.exit_code == 0
    assert result.output.strip() == str(tmp_path / "models" / "smollm2-135m-instruct")
