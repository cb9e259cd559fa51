"""The k8s backend's preflight passes against the real cluster (its trips need no cluster:
tests/sandbox_backends/test_backend_preflight.py)."""

from __future__ import annotations

import pytest
from k8s_support import NAMESPACE

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, run_checks

pytestmark = pytest.mark.k8s


def _result(name: str, kubeconfig):
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "k8s"},
        sets=[f'backend.kubeconfig="{kubeconfig}"', f'backend.namespace="{NAMESPACE}"'],
    )
    checks = [c for c in plugins.preflight_checks() if c.name == name]
    report = run_checks(checks, Context(config=cfg, plugins=plugins))
    [result] = [line.result for line in report.lines]
    return result


@pytest.mark.timeout(60)
def test_k8s_api_check_passes_on_the_cluster(kubeconfig):
    result = _result("k8s-api", kubeconfig)
    assert result.status == "pass", result
    assert NAMESPACE in result.message and "Kubernetes v" in result.message


@pytest.mark.timeout(60)
def test_k8s_pids_check_reads_the_cluster_process_limit(kubeconfig):
    """The local cluster's kubelet sets podPidsLimit (up.sh): the check reads it back from
    the node's /configz through the API server."""
    result = _result("k8s-pids", kubeconfig)
    assert result.status == "pass", result
    assert "limited to 4096 processes (podPidsLimit) on all 1 node(s)" in result.message
