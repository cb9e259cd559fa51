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
    assert json.loads((target / "slr-model.json").read_text())["format"] == 1
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
