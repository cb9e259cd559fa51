"""A Ray cluster simulated on this machine: a head and one node per role, all on 127.0.0.1.

Each role node carries its own custom resource (``engine``, ``sandbox``, ...), so an actor
that asks for ``{engine = 1}`` lands on the engine node, and a test can assert where things
ran by node id. Starting one costs seconds: the ``ray_cluster`` fixture starts it once per
test session, and this process's driver is connected to it (``slr.cluster.ray_runtime.connect``
then reuses that connection and never shuts it down).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from attrs import frozen

from slr.cluster.ray_runtime import LOOPBACK, stay_on_loopback

#: One entry per node besides the head: (role, CPUs, units of the role's custom resource).
#: Two engine nodes with one unit each: two replicas asking {engine = 1} land on different
#: nodes.
DEFAULT_NODES: tuple[tuple[str, int, int], ...] = (
    ("engine", 1, 1),
    ("engine", 1, 1),
    ("sandbox", 1, 2),
)


@frozen(kw_only=True)
class SimulatedCluster:
    address: str
    head_node_id: str
    nodes: tuple[tuple[str, str], ...]  # (role, node id in hex), one per node
    cluster: Any  # the ray.cluster_utils.Cluster

    def node_ids(self, role: str) -> list[str]:
        return [node for r, node in self.nodes if r == role]


@contextmanager
def simulated_cluster(
    nodes: Sequence[tuple[str, int, int]] = DEFAULT_NODES, *, head_cpus: int = 1
) -> Iterator[SimulatedCluster]:
    """Start the cluster and connect this process to it; tear both down at the end."""
    stay_on_loopback()
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError(
            "ray is already initialized in this process; the simulated cluster must be the "
            "first Ray connection (use the session-scoped ray_cluster fixture)"
        )
    common = {"node_ip_address": LOOPBACK, "object_store_memory": 200 * 1024 * 1024}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": head_cpus, "include_dashboard": False, **common},
    )
    try:
        started = []
        for role, cpus, units in nodes:
            node = cluster.add_node(num_cpus=cpus, resources={role: units}, **common)
            started.append((role, node.node_id))
        head = cluster.head_node
        assert head is not None  # initialize_head=True started it
        ray.init(address=cluster.address, configure_logging=False)
        try:
            yield SimulatedCluster(
                address=str(cluster.address),
                head_node_id=head.node_id,
                nodes=tuple(started),
                cluster=cluster,
            )
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
