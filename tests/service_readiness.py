"""The services the suite's marked tests need, waited for until they can do the work.

One session fixture per service, and ``conftest.py`` puts it in front of every test
carrying the service's marker, so a test never runs before its service is usable, whatever
order pytest-xdist hands the files out in:

- ``k8s_cluster`` (``@pytest.mark.k8s``): CI starts the local cluster in the background
  (its first start builds Kubernetes while the other tests run). Ready means more than an
  answering apiserver: the node Ready and untainted, the tests' namespace created and
  Active with its ``default`` service account, the tests' image on the node, and a probe
  pod from that image scheduled and run to completion.
- ``docker_daemon`` (``@pytest.mark.docker``): the daemon answers and holds the base image
  that task Dockerfiles start from.

A service that is missing or never becomes ready fails the test with the step that did not
happen and what to do; it never skips.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import attrs
import pytest

K8S_NAMESPACE = "slr-test"
# Built by the local cluster's up.sh (SLR_K8S_PYIMAGE=1): Debian minbase with bash and python3.
K8S_PY_IMAGE = "docker.io/library/python:local"
# Once the background start has finished, how long each readiness step may take.
K8S_STEP_S = 180.0


@attrs.frozen(kw_only=True)
class K8sCluster:
    """A cluster the k8s tests can use now: where to reach it and where they work."""

    kubeconfig: str
    containerd_address: str
    namespace: str = K8S_NAMESPACE


class NotReady(Exception):
    """A service did not become ready: the message names the step and the fix."""


def _poll(what: str, probe, timeout_s: float, interval_s: float = 1.0):
    """``probe()`` until it returns something truthy; ``NotReady`` naming ``what`` (and the
    last thing the probe said) after ``timeout_s``. Waits on another system's state, never on
    the tests' own threads."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        try:
            result = probe()
        except NotReady:
            raise
        except Exception as exc:  # the service is still starting: keep asking
            result, last = None, f"{type(exc).__name__}: {str(exc)[:300]}"
        if result:
            return result
        if time.monotonic() > deadline:
            raise NotReady(f"{what}: not after {timeout_s:.0f} s (last: {last})")
        time.sleep(interval_s)


# -- Kubernetes -------------------------------------------------------------------------


def wait_for_background_cluster() -> None:
    """CI starts the cluster in the background; ``SLR_K8S_STATUS_FILE`` appears with
    scripts/k8s-up's exit code when it is done, and ``SLR_K8S_ENV_FILE`` holds the exports it
    printed (copied into this process's environment)."""
    status = os.environ.get("SLR_K8S_STATUS_FILE")
    if not status:
        return
    wait_s = float(os.environ.get("SLR_K8S_WAIT_S", "2400"))
    _poll(
        "scripts/k8s-up (started in the background by scripts/test) to finish",
        lambda: Path(status).exists(),
        wait_s,
        interval_s=2.0,
    )
    code = Path(status).read_text().strip()
    if code != "0":
        log = os.environ.get("SLR_K8S_UP_LOG", "")
        tail = Path(log).read_text()[-3000:] if log and Path(log).exists() else ""
        raise NotReady(f"scripts/k8s-up failed (exit {code}):\n{tail}")
    env_file = os.environ.get("SLR_K8S_ENV_FILE", "")
    if env_file and Path(env_file).is_file():
        for line in Path(env_file).read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            os.environ[key.strip()] = value.strip()


def _node_ready(node) -> bool:
    conditions = {c.type: c.status for c in node.status.conditions or []}
    # the node lifecycle controller lifts its not-ready taints a moment after Ready: pods
    # stay Pending until then
    tainted = any(t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or [])
    return conditions.get("Ready") == "True" and not tainted


def _namespace_active(core, namespace: str) -> bool:
    from kubernetes import client

    try:
        ns = core.read_namespace(namespace, _request_timeout=10)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        try:
            core.create_namespace({"metadata": {"name": namespace}}, _request_timeout=10)
        except client.ApiException as created:
            if created.status != 409:  # 409: another test process made it first
                raise
        return False  # read it again: Active, or still Terminating from an earlier run
    return ns.status.phase == "Active"


def _image_on_node(core, image: str) -> bool:
    return any(
        image in (entry.names or [])
        for node in core.list_node().items
        for entry in node.status.images or []
    )


def _probe_pod(core, namespace: str) -> str:
    """A pod of the tests' image, run to completion: the scheduler, the kubelet, the image,
    the service account's token and the pod network all work. Returns its name."""
    from kubernetes import client

    name = f"slr-ready-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    body = {
        "metadata": {"name": name, "labels": {"slr.test/readiness": "1"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "probe",
                    "image": K8S_PY_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", "print('ready')"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }
    _poll(
        f"creating a probe pod in namespace {namespace!r}",
        lambda: core.create_namespaced_pod(namespace, body, _request_timeout=10),
        K8S_STEP_S,
    )
    try:

        def done() -> bool:
            pod = core.read_namespaced_pod(name, namespace, _request_timeout=10)
            if pod.status.phase == "Failed":
                raise NotReady(f"the probe pod {name} failed: {pod.status}")
            return pod.status.phase == "Succeeded"

        _poll(f"the probe pod {name} ({K8S_PY_IMAGE}) to run to completion", done, K8S_STEP_S)
    finally:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _request_timeout=10)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    return name


def k8s_ready(namespace: str = K8S_NAMESPACE) -> K8sCluster:
    """Wait until the cluster can run the tests' pods (see the module docstring)."""
    from kubernetes import client, config

    wait_for_background_cluster()
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not kubeconfig or not Path(kubeconfig).is_file():
        raise NotReady(
            f"the k8s tests need a real cluster, and KUBECONFIG is {kubeconfig!r}: start one with "
            f'`eval "$(scripts/k8s-up)"` (../shared/k8s-local), or deselect them with -m "not k8s"'
        )
    containerd = os.environ.get("SLR_K8S_CONTAINERD") or str(
        Path(kubeconfig).parent / "containerd.sock"
    )
    if not Path(containerd).exists():
        raise NotReady(
            f"no containerd socket at {containerd}: set SLR_K8S_CONTAINERD (scripts/k8s-up "
            f"prints it)"
        )
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = client.ApiClient(cfg)
    try:
        core = client.CoreV1Api(api)
        _poll(
            f"the apiserver in {kubeconfig} to answer",
            lambda: client.VersionApi(api).get_code(_request_timeout=10),
            K8S_STEP_S,
        )
        _poll(
            "a node Ready and without not-ready taints",
            lambda: any(_node_ready(n) for n in core.list_node(_request_timeout=10).items),
            K8S_STEP_S,
        )
        _poll(
            f"namespace {namespace!r} Active",
            lambda: _namespace_active(core, namespace),
            K8S_STEP_S,
        )
        _poll(
            f"the default service account of namespace {namespace!r}",
            lambda: core.list_namespaced_service_account(namespace, _request_timeout=10).items,
            K8S_STEP_S,
        )
        _poll(
            f"image {K8S_PY_IMAGE} on the node (scripts/k8s-up builds it with SLR_K8S_PYIMAGE=1)",
            lambda: _image_on_node(core, K8S_PY_IMAGE),
            60.0,
            interval_s=2.0,
        )
        _probe_pod(core, namespace)
    finally:
        api.close()
    return K8sCluster(kubeconfig=kubeconfig, containerd_address=containerd, namespace=namespace)


@pytest.fixture(scope="session")
def k8s_cluster() -> K8sCluster:
    """The local cluster, ready for the tests' pods; fails (never skips) when it is not."""
    try:
        return k8s_ready()
    except NotReady as exc:
        pytest.fail(f"the k8s cluster is not ready: {exc}", pytrace=False)


# -- docker -----------------------------------------------------------------------------


def docker_ready(timeout_s: float = 60.0):
    """A docker client whose daemon answers and holds the base image (``slr images base``)."""
    import docker
    from slr_backend_docker.base_image import BASE_TAG

    def answering():
        client = docker.from_env(timeout=30)
        if client.ping():
            return client
        client.close()
        return None

    client = _poll(
        "the docker daemon to answer (scripts/test starts dockerd)", answering, timeout_s
    )
    try:
        client.images.get(BASE_TAG)
    except docker.errors.ImageNotFound:
        raise NotReady(
            f"the docker daemon has no {BASE_TAG}: build it with `slr images base` "
            f"(scripts/prepare-caches does)"
        ) from None
    return client


@pytest.fixture(scope="session")
def docker_daemon():
    """The docker daemon, answering and with the base image; fails (never skips) otherwise."""
    try:
        client = docker_ready()
    except NotReady as exc:
        pytest.fail(f"docker is not ready: {exc}", pytrace=False)
    yield client
    client.close()


# The fixture every test with the marker gets first (conftest.py).
BY_MARKER = {"k8s": "k8s_cluster", "docker": "docker_daemon"}
