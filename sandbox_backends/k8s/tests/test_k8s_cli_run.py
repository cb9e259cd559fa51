"""`slr run --agent claude-code --backend k8s`, the real CLI, on the real cluster.

One run is SIGKILLed mid-rollout (its pods are running the agent) and resumed with
``slr run --resume``: the killed run's pods must survive the kill (nothing cleans up after
a SIGKILL) and be removed, by label, when the next run starts; the resumed run must then
complete every trial end to end: the real Claude Code binary from its cached bundle (mounted
into the pods, never installed per trial), the proxy, the embedded hf engine, the Harbor
verifier, and no pod left afterwards.

The policy is a tiny random model: Claude Code makes real model calls that the proxy
samples and records token by token (a reward of 1 is not the point here; tests/adapters
teaches policies for that).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from k8s_support import NAMESPACE
from slr_backend_k8s.podspec import label_value

from slr.run.directory import RunDir
from slr.sandboxing.labels import OWNER_PID, RUN

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SLR = str(Path(sys.executable).with_name("slr"))
TRIALS = 2


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory) -> Path:
    from slr_testkit import tiny

    # Claude Code's first prompt is ~4.4k tokens: give the tiny model room for it.
    model, tok = tiny.tiny_model(hidden=32, layers=1, max_context=8192)
    return tiny.save(model, tok, tmp_path_factory.mktemp("tiny") / "model")


def write_config(path: Path, model: Path, kubeconfig: str, containerd: str) -> Path:
    path.write_text(
        f"""
[run]
name = "k8s-cli"
runs_dir = "{path.parent / "runs"}"
steps = 1
[tasks]
path = "{ROOT / "examples" / "tasks"}"
include = ["hello-world"]
[rollout]
tasks_per_step = 1
n_per_task = {TRIALS}
concurrency = {TRIALS}
max_tokens = 16
[agent]
name = "claude-code"
max_turns = 2
[backend]
name = "k8s"
kubeconfig = "{kubeconfig}"
namespace = "{NAMESPACE}"
containerd_address = "{containerd}"
request_ratio = 0.05
pod_start_timeout_s = 90
[engine]
name = "hf"
model = "{model}"
"""
    )
    return path


def pods(api, **labels: str) -> list:
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    return api.list_namespaced_pod(NAMESPACE, label_selector=selector).items


@pytest.fixture
def core_api(kubeconfig):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = client.ApiClient(cfg)
    yield client.CoreV1Api(api)
    api.close()


def test_killed_run_leaves_pods_the_next_start_removes_then_trials_complete(
    tmp_path, tiny_policy, kubeconfig, containerd_address, core_api
):
    cfg = write_config(tmp_path / "run.toml", tiny_policy, kubeconfig, containerd_address)
    log = tmp_path / "killed.log"  # a file, not a pipe: nobody reads it while the run goes
    with log.open("w") as out:
        killed = subprocess.Popen(
            [SLR, "run", "-c", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while True:  # until a trial's pod runs: its agent phase is under way
            # (preflight's proxy-reach probe runs a pod of its own before the run directory
            # exists: only a pod labelled with the run's id is a trial's)
            made = [c.parent.name for c in (tmp_path / "runs").glob("*/config.toml")]
            running = [
                p.metadata.name
                for p in pods(core_api, **{OWNER_PID: str(killed.pid)})
                if p.status.phase == "Running"
                and made
                and p.metadata.labels.get(RUN) == label_value(made[0])
            ]
            if running:
                break
            if killed.poll() is not None:
                pytest.fail(f"the run ended before its pods ran:\n{log.read_text()[-3000:]}")
            assert time.monotonic() < deadline, "the run's pods never reached Running"
            time.sleep(0.2)  # polling the API server, not synchronising on time
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # a crash: no clean-up code runs
        killed.wait()
    left = pods(core_api, **{OWNER_PID: str(killed.pid)})
    assert set(running) <= {p.metadata.name for p in left}, (
        "a SIGKILLed run's pods should outlive it"
    )

    (run_path,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    # The run labels its pods with its id: the last check selects by that label, and would
    # pass vacuously if the pods were labelled under another key.
    run_label = label_value(RunDir.open(run_path).id)
    assert {p.metadata.labels.get(RUN) for p in left} == {run_label}, [
        p.metadata.labels for p in left
    ]
    res = subprocess.run(
        [SLR, "run", "--resume", str(run_path)], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-4000:]

    # the next start removed the orphans, by their labels (owner process dead)
    removed = {
        json.loads(line).get("pod")
        for line in res.stderr.splitlines()
        if line.startswith("{") and "removed orphaned trial pod" in line
    }
    assert set(running) <= removed, res.stderr[-4000:]
    assert pods(core_api, **{OWNER_PID: str(killed.pid)}) == []

    run = RunDir.open(run_path)
    trials = list(run.trials())
    assert len(trials) == TRIALS
    for t in trials:
        why = f"{t.trial_id}: {t.error}\n" + "\n".join(
            f"--- {k}\n{v[-1500:]}" for k, v in t.logs.items()
        )
        assert t.termination.value == "completed", why
        # the real Claude Code, from its bundle, called the policy through the proxy
        assert json.loads(t.logs["agent.bundle"])["bundle"].startswith("claude-code-"), why
        assert t.agent == "claude-code" and t.agent_version, why
        traj = t.trajectory
        assert traj is not None and traj.num_calls >= 1 and traj.segments, why
        for seg in traj.segments:
            assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs)
        policy = [
            lp
            for seg in traj.segments
            for m, lp in zip(seg.loss_mask, seg.logprobs, strict=True)
            if m
        ]
        assert policy and all(math.isfinite(lp) and lp <= 0 for lp in policy), why
        # the verifier ran in the pod (the tiny policy does not solve the task)
        assert t.reward is not None and t.reward.details["exit_code"] == 0, why
        assert t.timings["verifier_s"] > 0, why
    assert [m["step"] for m in run.metrics()] == [1]
    # no pod of this run is left, the killed start's included
    assert pods(core_api, **{RUN: run_label}) == []
