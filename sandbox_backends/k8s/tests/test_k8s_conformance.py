"""The shared sandbox contract, against real pods on the local cluster.

``backend`` (session, network = 'loopback') comes from conftest.py, ``example_tasks`` from
tests/backend_fixtures.py: the bundled example tasks, built by the docker builder
and loaded into the cluster's containerd.
"""

import pytest

from slr_testkit.conformance import SandboxBackendTests

pytestmark = pytest.mark.k8s


class TestK8sConformance(SandboxBackendTests):
    @pytest.fixture
    def unreachable_hosts(self, pod_gateway) -> list[str]:
        # The host's own address on the pod network: open to any pod that has a network.
        return ["127.0.0.1", pod_gateway]
