"""Failures a user meets, each with an error that names the cause and the fix. Real cluster."""

from __future__ import annotations

import asyncio
import base64
import socket
import time

import attrs
import pytest
import yaml
from k8s_support import NAMESPACE, py_task, run
from slr_backend_k8s.api import (
    ApiUnreachable,
    ImageUnavailable,
    PermissionDenied,
    PodStartTimeout,
    QuotaExceeded,
)
from slr_backend_k8s.backend import K8sBackend

from slr.sandboxing.labels import TRIAL

pytestmark = pytest.mark.k8s


def _backend(k8s_config, **overrides) -> K8sBackend:
    return K8sBackend(attrs.evolve(k8s_config, **overrides))


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_api_server(k8s_config, kubeconfig, tmp_path):
    data = yaml.safe_load(open(kubeconfig))
    url = f"https://127.0.0.1:{_closed_port()}"
    data["clusters"][0]["cluster"]["server"] = url
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(data))
    b = _backend(k8s_config, kubeconfig=str(path))
    started = time.monotonic()
    try:
        with pytest.raises(ApiUnreachable, match="cannot reach the Kubernetes API server") as info:
            run(b.start(py_task(), trial_id="t", labels={}))
        assert url in str(info.value) and "KUBECONFIG" in str(info.value)
        with pytest.raises(ApiUnreachable):
            run(b.cleanup_orphans())
    finally:
        run(b.close())
    assert time.monotonic() - started < 30


def test_missing_kubeconfig(k8s_config, tmp_path):
    b = _backend(k8s_config, kubeconfig=str(tmp_path / "none"))
    with pytest.raises(ApiUnreachable, match="no kubeconfig at"):
        run(b.cleanup_orphans())


def test_image_missing_everywhere_fails_before_any_pod(k8s_config):
    b = _backend(k8s_config)
    try:
        task = py_task(docker_image="docker.io/library/slr-missing:1")
        with pytest.raises(ImageUnavailable, match="slr-missing:1"):
            run(b.start(task, trial_id="missing", labels={}))
        assert b.list_pods(**{TRIAL: "missing"}) == []
    finally:
        run(b.close())


def test_image_missing_on_the_node_fails_fast_with_the_pull_policy(k8s_config):
    b = _backend(k8s_config, image_load="none", image_pull_policy="Never")
    started = time.monotonic()
    try:
        task = py_task(docker_image="docker.io/library/slr-missing:2")
        with pytest.raises(ImageUnavailable, match="ErrImageNeverPull") as info:
            run(b.start(task, trial_id="missing2", labels={}))
        assert "imagePullPolicy is Never" in str(info.value)
        assert b.list_pods(**{TRIAL: "missing2"}) == []
    finally:
        run(b.close())
    assert time.monotonic() - started < k8s_config.pod_start_timeout_s


def test_pod_start_timeout_is_its_own_error(k8s_config):
    b = _backend(k8s_config, node_selector={"slr.test/no-such-node": "x"}, pod_start_timeout_s=3)
    try:
        with pytest.raises(PodStartTimeout, match="pod_start_timeout_s = 3s") as info:
            run(b.start(py_task(), trial_id="unschedulable", labels={}))
        assert "not the agent's timeout" in str(info.value)
        assert b.list_pods(**{TRIAL: "unschedulable"}) == []
    finally:
        run(b.close())


@pytest.fixture
def admin_core(kubeconfig):
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig)
    yield client.CoreV1Api(api)
    api.close()


@pytest.fixture
def quota_namespace(admin_core):
    ns = f"slr-quota-{int(time.time() * 1000) % 100000}"
    admin_core.create_namespace({"metadata": {"name": ns}})
    admin_core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "tiny"}, "spec": {"hard": {"limits.memory": "64Mi"}}}
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the quota controller fills in status.hard first
        quota = admin_core.read_namespaced_resource_quota("tiny", ns)
        if quota.status and quota.status.hard:
            break
        time.sleep(0.2)
    yield ns
    admin_core.delete_namespace(ns)


def test_quota_denial(k8s_config, quota_namespace):
    b = _backend(k8s_config, namespace=quota_namespace, network_policy=False)
    try:
        with pytest.raises(QuotaExceeded, match="exceeded quota") as info:
            run(b.start(py_task(), trial_id="quota", labels={}))
        assert "max_concurrent_pods" in str(info.value)
    finally:
        run(b.close())


@pytest.fixture
def unprivileged_kubeconfig(admin_core, kubeconfig, tmp_path):
    """A kubeconfig for a service account that may do nothing at all."""
    name = "slr-test-noperm"
    try:
        admin_core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": name}})
    except Exception as exc:
        if getattr(exc, "status", None) != 409:
            raise
    token = None
    deadline = time.monotonic() + 60
    while token is None and time.monotonic() < deadline:  # the token controller makes it
        sa = admin_core.read_namespaced_service_account(name, NAMESPACE)
        for ref in sa.secrets or []:
            secret = admin_core.read_namespaced_secret(ref.name, NAMESPACE)
            token = base64.b64decode(secret.data["token"]).decode()
        if token is None:
            time.sleep(0.2)
    assert token, "the service account got no token"
    data = yaml.safe_load(open(kubeconfig))
    data["users"][0]["user"] = {"token": token}
    path = tmp_path / "noperm.kubeconfig"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_missing_rbac_permission(k8s_config, unprivileged_kubeconfig):
    b = _backend(k8s_config, kubeconfig=unprivileged_kubeconfig)
    try:
        with pytest.raises(PermissionDenied, match="RBAC") as info:
            run(b.cleanup_orphans())
        assert "pods/exec" in str(info.value)  # the message lists what to grant
        with pytest.raises(PermissionDenied, match="creating pod"):
            run(b.start(py_task(), trial_id="rbac", labels={}))
    finally:
        run(b.close())


def test_concurrency_limit_makes_starts_wait(k8s_config, trial_id):
    b = _backend(k8s_config, max_concurrent_pods=1)

    async def scenario():
        first = await b.start(py_task(), trial_id=trial_id + "-1", labels={})
        second = asyncio.ensure_future(b.start(py_task(), trial_id=trial_id + "-2", labels={}))
        done, _ = await asyncio.wait({second}, timeout=3)
        assert not done, "a second pod started while the limit was 1"
        assert len(b.list_pods(**{TRIAL: trial_id + "-2"})) == 0
        await first.stop()
        sb = await asyncio.wait_for(second, timeout=60)
        await sb.stop()

    try:
        run(scenario())
    finally:
        run(b.close())
