"""Fixtures for the k8s backend tests: a real cluster, reached through KUBECONFIG.

CI brings the cluster up with ``scripts/k8s-up`` (which prints the ``export KUBECONFIG=...``
and ``export SLR_K8S_CONTAINERD=...`` lines to eval) and down with ``scripts/k8s-down``.
Every test here waits for the suite's ``k8s_cluster`` fixture first (the repository's conftest.py), so
none reaches the cluster before it can run pods. A missing cluster fails these tests; it
never skips them.
"""

from __future__ import annotations

import os
import uuid

import attrs
import pytest
from backend_fixtures import example_tasks, registry, verifier  # noqa: F401 (fixtures)
from k8s_support import NAMESPACE, py_task, run
from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.backend import K8sBackend
from slr_backend_k8s.forward import local_address_towards

from slr.sandboxing.labels import OWNER_PID, RUN


@pytest.fixture(scope="session")
def kubeconfig(k8s_cluster) -> str:
    """The cluster's kubeconfig, once the cluster is ready for pods (tests/service_readiness.py:
    the node, the namespace, its service account, the image, a probe pod that ran)."""
    return k8s_cluster.kubeconfig


@pytest.fixture(scope="session")
def containerd_address(k8s_cluster) -> str:
    return k8s_cluster.containerd_address


@pytest.fixture(scope="session")
def k8s_config(kubeconfig, containerd_address) -> K8sBackendConfig:
    return K8sBackendConfig(
        kubeconfig=kubeconfig,
        namespace=NAMESPACE,
        containerd_address=containerd_address,
        # A 2-core dev node: requests far below limits, so 8 trials fit at once.
        request_ratio=0.05,
        pod_start_timeout_s=90,
    )


@pytest.fixture(scope="session")
def backend(k8s_config):
    """The default backend (network = 'loopback'); no pod of this process may outlive it."""
    b = K8sBackend(k8s_config)
    yield b
    leftovers = [p.metadata.name for p in b.list_pods(**{OWNER_PID: str(os.getpid())})]
    run(b.close())
    assert leftovers == [], f"pods left behind: {leftovers}"


@pytest.fixture(scope="session")
def policy_backend(k8s_config):
    """network = 'policy': the pod keeps eth0, a NetworkPolicy fences it, TCP proxy link."""
    b = K8sBackend(attrs.evolve(k8s_config, network="policy"))
    yield b
    run(b.close())


@pytest.fixture
def trial_id() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sandbox(backend, trial_id):
    sb = run(backend.start(py_task(), trial_id=trial_id, labels={RUN: "tests"}))
    yield sb
    run(sb.stop())


@pytest.fixture
def policy_sandbox(policy_backend, trial_id):
    sb = run(policy_backend.start(py_task(), trial_id=trial_id, labels={RUN: "tests"}))
    yield sb
    run(sb.stop())


@pytest.fixture(scope="session")
def pod_gateway(policy_backend) -> str:
    """This machine's address on the pod network (what a pod with a network could dial)."""
    sb = run(policy_backend.start(py_task("gw"), trial_id="gateway-probe", labels={}))
    try:
        return local_address_towards(sb.pod_ip)
    finally:
        run(sb.stop())
