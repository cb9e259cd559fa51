"""The suite's k8s readiness (tests/service_readiness.py) on the real cluster: a cold cluster
has no test namespace, and a test that reached it before the readiness fixture met
"namespace does not exist" (a fresh machine's run: 17 k8s errors from that one race)."""

from __future__ import annotations

import uuid

import attrs
import pytest
from k8s_support import py_task, run
from service_readiness import BY_MARKER, k8s_ready
from slr_backend_k8s.api import K8sError
from slr_backend_k8s.backend import K8sBackend

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]


def test_a_new_namespace_is_made_ready_for_pods(k8s_config, kubeconfig):
    """What a cold cluster looks like to the tests: their namespace is missing, and a pod
    cannot start there. The readiness step makes it, waits for it and runs a probe pod in
    it; then the backend's pods start."""
    from kubernetes import client, config

    namespace = f"slr-ready-{uuid.uuid4().hex[:8]}"
    b = K8sBackend(attrs.evolve(k8s_config, namespace=namespace))
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        with pytest.raises(K8sError, match=f"namespace '{namespace}' does not exist"):
            run(b.start(py_task(), trial_id="cold", labels={}))
        cluster = k8s_ready(namespace)
        assert cluster.namespace == namespace and cluster.kubeconfig == kubeconfig
        sandbox = run(b.start(py_task(), trial_id="warm", labels={}))
        try:
            assert run(sandbox.exec("echo ready")).stdout == "ready\n"
        finally:
            run(sandbox.stop())
        # the probe pod is gone: readiness leaves nothing behind
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
        assert [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None] == []
    finally:
        run(b.close())
        client.CoreV1Api(api).delete_namespace(namespace)
        api.close()


def test_every_marked_test_sets_up_its_service_first(request):
    """Whatever file a test process gets first, a k8s (docker) test's first fixture is the
    cluster's (daemon's) readiness: conftest.py puts it there at collection."""
    marked = 0
    for item in request.session.items:
        wanted = [f for m, f in BY_MARKER.items() if item.get_closest_marker(m)]
        others = set(BY_MARKER.values()) - set(wanted)
        marked += bool(wanted)
        assert item.fixturenames[: len(wanted)] == wanted, (item.nodeid, item.fixturenames)
        assert not others & set(item.fixturenames), (item.nodeid, item.fixturenames)
    assert marked > 0
