"""Whole trials on real pods: a pod deleted mid-trial, task pods' spec, nothing left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from k8s_support import NAMESPACE, run
from kubernetes.utils import parse_quantity

from slr.contracts import AgentAdapter, AgentOutcome, Bundle, TerminationReason
from slr.plugins import get_plugin_manager
from slr.rollout.trial import StandInSessions, run_trial, run_trials
from slr.sandboxing.labels import RUN, TASK, TRIAL

pytestmark = pytest.mark.k8s


class DeletesItsPod(AgentAdapter):
    """An agent whose pod is deleted from outside while its command runs."""

    protocol = "openai"

    def __init__(self, backend):
        self.backend = backend
        self.labels = None

    def bundle(self):
        return Bundle(path=Path("/nonexistent-slr-bundle"), version="t")

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        core = self.backend.api.core
        pod = await asyncio.to_thread(core.read_namespaced_pod, sandbox.name, NAMESPACE)
        self.labels = pod.metadata.labels
        running = asyncio.ensure_future(sandbox.exec("sleep 600"))
        await asyncio.to_thread(
            core.delete_namespaced_pod, sandbox.name, NAMESPACE, grace_period_seconds=0
        )
        await running  # raises SandboxError: the pod is gone
        return AgentOutcome(exit_code=0)


def test_pod_deleted_mid_trial_is_a_sandbox_error_and_the_run_goes_on(backend, example_tasks):
    killer = DeletesItsPod(backend)
    oracle = get_plugin_manager().get("agent", "oracle").load()()
    verifier = get_plugin_manager().get("verifier", "harbor").load()()
    task = example_tasks[0]
    results = run(
        run_trials(
            [
                lambda agent=agent: run_trial(
                    task,
                    backend=backend,
                    agent=agent,
                    verifier=verifier,
                    session_factory=StandInSessions(),
                    labels={RUN: "k8s-mid-trial"},
                )
                for agent in (killer, oracle)
            ],
            concurrency=2,
        )
    )
    lost, good = results
    assert lost.termination == TerminationReason.SANDBOX_ERROR, lost.error
    assert "deleted" in lost.error
    assert lost.reward is None and not lost.trainable
    assert killer.labels[TRIAL] == lost.trial_id
    assert good.termination == TerminationReason.COMPLETED and good.reward.value == 1.0
    assert backend.list_pods(**{RUN: "k8s-mid-trial"}) == []


def test_task_pod_has_the_tasks_limits_labels_and_workdir(backend, example_tasks):
    task = next(t for t in example_tasks if t.id == "fix-median")

    async def go():
        sb = await backend.start(task, trial_id="limits-1", labels={RUN: "r1"})
        try:
            pod = await backend.call(backend.api.core.read_namespaced_pod, sb.name, NAMESPACE)
            pwd = await sb.exec("pwd")
            return pod, pwd
        finally:
            await sb.stop()

    pod, pwd = run(go())
    limits = pod.spec.containers[0].resources.limits
    assert parse_quantity(limits["memory"]) == task.environment.memory_mb * 2**20
    assert parse_quantity(limits["cpu"]) == parse_quantity(str(task.environment.cpus))
    labels = pod.metadata.labels
    assert labels[TRIAL] == "limits-1" and labels[RUN] == "r1"
    assert labels[TASK] == "fix-median"
    assert pod.spec.containers[0].image_pull_policy == "Never"
    assert pwd.stdout.strip() == "/app"
