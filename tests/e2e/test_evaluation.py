"""`slr eval` end to end with a real policy: the base model, then a checkpoint of `slr run`.

mini-swe-agent (the real bundle) on the local backend talks to a tiny random model through
the proxy; the tiny model does not solve hello-world, so every trial scores 0 and the
counts are known. The checkpoint comes from a one-step `slr run` whose update is sure to
change the weights (gae: the value loss moves the shared trunk whatever the rewards), and
the log-probs the proxy recorded during the eval must be the checkpoint's, not the base
model's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slr.run import checkpoints
from slr.run.directory import RunDir

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SLR = str(Path(sys.executable).with_name("slr"))
HELLO = ROOT / "examples" / "tasks" / "hello-world"


def write_config(path: Path, model: Path) -> Path:
    path.write_text(
        f"""
[run]
name = "tiny"
runs_dir = "{path.parent / "runs"}"
steps = 1
[tasks]
path = "{HELLO}"
[rollout]
tasks_per_step = 1
n_per_task = 2
concurrency = 2
max_tokens = 8
[algorithm]
adv_estimator = "gae"
[agent]
name = "mini-swe-agent"
step_limit = 1
[backend]
name = "local"
[engine]
name = "hf"
model = "{model}"
[optimizer]
name = "torch"
model = "{model}"
lr = 0.01
drop_zero_variance_groups = false
"""
    )
    return path


def slr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SLR, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def policy_logprobs(model_dir: Path, trial: dict) -> list[float]:
    """A forward pass of ``model_dir`` over the trial's tokens: the policy tokens' log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    for seg in trial["trajectory"]["segments"]:
        ids = torch.tensor([seg["token_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        out += [
            logp[i - 1, seg["token_ids"][i]].item()
            for i, m in enumerate(seg["loss_mask"])
            if m and i > 0
        ]
    return out


def recorded_logprobs(trial: dict) -> list[float]:
    return [
        lp
        for seg in trial["trajectory"]["segments"]
        for i, (lp, m) in enumerate(zip(seg["logprobs"], seg["loss_mask"], strict=True))
        if m and i > 0
    ]


def test_eval_the_base_model_k2_records_trials_and_a_summary(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path / "run.toml", tiny_model_dir)
    res = slr("eval", "-c", str(cfg), "-k", "2", "--output", str(tmp_path / "ev"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "pass@2" in res.stdout and "hello-world" in res.stdout
    summary = json.loads((tmp_path / "ev" / "eval.json").read_text())
    task = summary["tasks"]["hello-world"]
    assert (summary["trials"], task["n"], task["successes"], task["infra_failures"]) == (2, 2, 0, 0)
    assert task["pass_at"] == {"1": 0.0, "2": 0.0} and summary["pass_at"] == {"1": 0.0, "2": 0.0}
    assert sum(summary["terminations"].values()) == 2
    assert summary["model"] == str(tiny_model_dir) and summary["checkpoint"] is None
    assert summary["weights_version"] == 0 and summary["agent"] == "mini-swe-agent"
    assert summary["sampling"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8}
    run = RunDir.open(tmp_path / "ev")
    trials = list(run.trials())
    assert sorted(t.trial_id for t in trials) == ["hello-world-0", "hello-world-1"]
    assert all(t.trajectory.num_policy_tokens > 0 for t in trials)  # the model was called
    assert all((run.path / "trials" / t.trial_id / "proxy.json").is_file() for t in trials)
    assert [e["event"] for e in run.events()] == ["started", "finished"]


def test_eval_a_checkpoint_serves_its_weights(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path / "run.toml", tiny_model_dir)
    res = slr("run", "-c", str(cfg), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_path,) = (tmp_path / "runs").iterdir()
    ckpt = checkpoints.latest_checkpoint(run_path)
    assert json.loads((run_path / "metrics.jsonl").read_text())["optimizer/updates"] == 1

    # a run folder means its latest complete checkpoint; without -c its own config is used
    res = slr("eval", "--checkpoint", str(run_path), "-k", "1", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["checkpoint"] == str(ckpt.resolve()) and summary["checkpoint_step"] == 1
    assert summary["model"] == str((ckpt / "policy").resolve())
    assert summary["weights_version"] == 1 and summary["trials"] == 1
    eval_run = RunDir.open(tmp_path / "runs" / summary["run_id"])
    (trial,) = [json.loads(p.read_text()) for p in (eval_run.path / "trials").glob("*.json")]
    assert trial["weights_version"] == 1
    served = recorded_logprobs(trial)
    assert served
    assert served == pytest.approx(policy_logprobs(ckpt / "policy", trial), abs=1e-3)
    base = policy_logprobs(tiny_model_dir, trial)
    assert max(abs(a - b) for a, b in zip(served, base, strict=True)) > 1e-2


def test_eval_a_bad_checkpoint_exits_2_naming_the_path(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path / "run.toml", tiny_model_dir)
    half = tmp_path / "runs" / "r" / "checkpoints" / "step-000003"
    half.mkdir(parents=True)
    res = slr("eval", "-c", str(cfg), "--checkpoint", str(half), cwd=tmp_path)
    assert res.returncode == 2
    assert f"'{half}' is not a complete checkpoint" in res.stderr
    assert "RUN/checkpoints/step-NNNNNN" in res.stderr
    assert not list((tmp_path / "runs").glob("eval-*"))  # refused before anything ran
