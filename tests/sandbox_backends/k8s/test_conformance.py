"""The shared sandbox contract, against real pods on the local cluster."""

import pytest

from slr.testing.conformance import SandboxBackendTests

pytestmark = pytest.mark.k8s


class TestK8sConformance(SandboxBackendTests):
    """``sandbox`` comes from conftest.py: a pod of the cluster's python image."""
