"""Fixtures for the k8s backend tests: a real cluster, reached through KUBECONFIG.

CI brings the cluster up with ``scripts/k8s-up`` (which prints the ``export KUBECONFIG=...``
and ``export SLR_K8S_CONTAINERD=...`` lines to eval) and down with ``scripts/k8s-down``.
A missing cluster fails these tests; it never skips them.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import attrs
import pytest
from k8s_support import NAMESPACE, py_task, run
from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.backend import K8sBackend
from slr_backend_k8s.forward import local_address_towards

from slr.sandboxing.labels import OWNER_PID, RUN


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    """The cluster's kubeconfig; fails (not skips) when there is no reachable cluster."""
    _wait_for_background_cluster()
    path = os.environ.get("KUBECONFIG")
    if not path or not Path(path).is_file():
        pytest.fail(
            f"the k8s tests need a real cluster, and KUBECONFIG is {path!r}: start one with "
            f'`eval "$(scripts/k8s-up)"` (../shared/k8s-local), or deselect them with -m "not k8s"',
            pytrace=False,
        )
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=cfg)
    api = client.ApiClient(cfg)
    try:
        client.VersionApi(api).get_code(_request_timeout=10)
        core = client.CoreV1Api(api)
        try:
            core.read_namespace(NAMESPACE)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        _wait_for_default_service_account(core)
    except Exception as exc:
        pytest.fail(
            f"the cluster in KUBECONFIG={path} is not usable: {exc}. Is it up (scripts/k8s-up)?",
            pytrace=False,
        )
    finally:
        api.close()
    return path


def _wait_for_background_cluster() -> None:
    """CI starts the cluster in the background (its first start builds Kubernetes) while the
    other tests run; ``SLR_K8S_STATUS_FILE`` appears with scripts/k8s-up's exit code when it
    is done, and ``SLR_K8S_ENV_FILE`` holds the exports it printed."""
    status = os.environ.get("SLR_K8S_STATUS_FILE")
    if not status:
        return
    wait_s = float(os.environ.get("SLR_K8S_WAIT_S", "2400"))
    deadline = time.monotonic() + wait_s
    while not Path(status).exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the cluster was not up after {wait_s:.0f} s", pytrace=False)
        time.sleep(2)  # waiting on another process's file, not synchronising tests
    code = Path(status).read_text().strip()
    if code != "0":
        log = os.environ.get("SLR_K8S_UP_LOG", "")
        tail = Path(log).read_text()[-3000:] if log and Path(log).exists() else ""
        pytest.fail(f"scripts/k8s-up failed (exit {code}):\n{tail}", pytrace=False)
    for line in Path(os.environ["SLR_K8S_ENV_FILE"]).read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        os.environ[key.strip()] = value.strip()


def _wait_for_default_service_account(core) -> None:
    # A new namespace gets its 'default' service account a moment later; pods need it.
    from kubernetes import watch

    if core.list_namespaced_service_account(NAMESPACE).items:
        return
    w = watch.Watch()
    for _ in w.stream(core.list_namespaced_service_account, NAMESPACE, timeout_seconds=30):
        w.stop()


@pytest.fixture(scope="session")
def containerd_address(kubeconfig) -> str:
    address = os.environ.get("SLR_K8S_CONTAINERD") or str(
        Path(kubeconfig).parent / "containerd.sock"
    )
    if not Path(address).exists():
        pytest.fail(
            f"no containerd socket at {address}: set SLR_K8S_CONTAINERD (scripts/k8s-up prints it)",
            pytrace=False,
        )
    return address


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
