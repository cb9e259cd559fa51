"""`slr serve`: a person points the official SDK at the printed URL; Ctrl-C writes the data."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from slr.run.directory import RunDir

SLR = str(Path(sys.executable).with_name("slr"))


@pytest.mark.slow
def test_serve_prints_urls_serves_and_writes_trajectories(tmp_path):
    from slr_testkit import tiny

    model, tok = tiny.tiny_model(hidden=32, layers=1)
    folder = tiny.save(model, tok, tmp_path / "model")
    proc = subprocess.Popen(
        [SLR, "serve", "--engine", "hf", "--set", f"engine.model={str(folder)!r}",
         "--set", f"run.runs_dir={str(tmp_path / 'runs')!r}", "--set", "rollout.max_tokens=8"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(lines)
        token = re.search(r"token (\S+)", text).group(1)
        base = re.search(r"openai\s+(\S+)", text).group(1)
        client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Hi"}], temperature=0
        )
        assert reply.choices[0].message.role == "assistant"
        assert reply.usage.completion_tokens >= 1
    finally:
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0
    assert "trajectories written" in rest
    (run_path,) = (tmp_path / "runs").iterdir()
    (trial,) = RunDir.open(run_path).trials()
    (segment,) = trial.trajectory.segments
    assert sum(segment.loss_mask) == reply.usage.completion_tokens
    assert (run_path / "trials" / trial.trial_id / "proxy.json").exists()
