"""Pod starts follow one watch instead of reading each pod every 0.2 s; no cluster needed.

``StandInPodApi`` stands in for the API server's pod endpoints (there is no cluster in these
unit tests; the k8s-marked tests run the same code against a real one). It speaks the wire
format: the kubernetes client's own ``Watch`` reads its event stream and turns each line
into a real ``V1Pod``, so the watch thread, the 410 re-list and the start's wait all run as
they do against a server. It counts every request.
"""

from __future__ import annotations

import json
import queue
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from kubernetes import client
from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.api import PodGone
from slr_backend_k8s.backend import K8sBackend
from slr_backend_k8s.podspec import CONTAINER
from slr_backend_k8s.watch import PodWatch

from slr.sandboxing.relay import READY

_END = object()


def pod(name: str, phase: str, *, running: bool = False) -> client.V1Pod:
    state = (
        client.V1ContainerState(running=client.V1ContainerStateRunning(started_at=None))
        if running
        else client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason="Creating"))
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="ns", resource_version="1"),
        spec=client.V1PodSpec(containers=[client.V1Container(name=CONTAINER)], node_name="n"),
        status=client.V1PodStatus(
            phase=phase,
            pod_ip="10.0.0.9",
            container_statuses=[
                client.V1ContainerStatus(
                    name=CONTAINER,
                    image="img",
                    image_id="",
                    ready=running,
                    restart_count=0,
                    state=state,
                )
            ],
        ),
    )


class _Stream:
    """A watch response: JSON event lines from a queue until closed."""

    status = 200

    def __init__(self):
        self.lines: queue.Queue = queue.Queue()

    def stream(self, amt=None, decode_content=False):
        while (line := self.lines.get()) is not _END:
            yield line

    def close(self):
        self.lines.put(_END)

    def release_conn(self):
        pass


class StandInPodApi:
    """The pod endpoints of an API server, in memory (see the module docstring)."""

    def __init__(self):
        self.calls: Counter[str] = Counter()
        self.pods: dict[str, client.V1Pod] = {}
        self.watches: queue.Queue[_Stream] = queue.Queue()
        self.reads: queue.Queue = queue.Queue()  # what read_namespaced_pod answers, in turn
        self.on_create = lambda name: None
        self._serial = client.ApiClient()

    def list_namespaced_pod(self, namespace, **kw):
        """:rtype: V1PodList"""
        if kw.get("watch"):
            self.calls["watch"] += 1
            s = _Stream()
            self.watches.put(s)
            return s
        self.calls["list"] += 1
        return client.V1PodList(
            items=list(self.pods.values()), metadata=client.V1ListMeta(resource_version="1")
        )

    def event(self, kind: str, obj: client.V1Pod) -> None:
        """Send one event on the newest watch (waits for the watch to be open)."""
        s = self.watches.get()
        self.watches.put(s)  # peeked, not taken: later events go to the same stream
        body = {"type": kind, "object": self._serial.sanitize_for_serialization(obj)}
        s.lines.put((json.dumps(body) + "\n").encode())

    def error(self, code: int) -> None:
        s = self.watches.get()
        body = {"type": "ERROR", "object": {"code": code, "reason": "Expired", "message": "old"}}
        s.lines.put((json.dumps(body) + "\n").encode())

    def create_namespaced_pod(self, namespace, body, **kw):
        self.calls["create"] += 1
        self.on_create(body["metadata"]["name"])

    def read_namespaced_pod(self, name, namespace, **kw):
        self.calls["read"] += 1
        answer = self.reads.get_nowait()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def read_namespaced_pod_log(self, name, namespace, **kw):
        self.calls["log"] += 1
        return READY + "\n"


def backend_on(api: StandInPodApi, **options) -> K8sBackend:
    b = K8sBackend(K8sBackendConfig(namespace="ns", network="policy", **options))
    b._api = SimpleNamespace(core=api, host="stand-in", source="test", close=lambda: None)  # type: ignore[assignment]
    return b


TASK = SimpleNamespace(id="task-1")


@pytest.mark.timeout(20)
def test_a_start_waits_on_the_watch_and_reads_no_pod():
    api = StandInPodApi()
    backend = backend_on(api)

    def scheduled(name):
        # the kubelet's progress, as the watch reports it
        api.event("ADDED", pod(name, "Pending"))
        api.event("MODIFIED", pod(name, "Running", running=True))

    api.on_create = scheduled
    try:
        backend.watch.start()
        got = backend._create_and_wait("p1", {"metadata": {"name": "p1"}}, "img", TASK)
    finally:
        backend.watch.stop()
    assert got.status.phase == "Running" and isinstance(got, client.V1Pod)
    # before: one read every 0.2 s until it ran; now: one list and one watch for all pods
    assert api.calls == Counter({"create": 1, "list": 1, "watch": 1})


@pytest.mark.timeout(20)
def test_without_watch_events_a_start_reads_its_pod_at_the_fallback_bound():
    api = StandInPodApi()
    backend = backend_on(api, watch_fallback_s=0.05)
    for answer in (pod("p1", "Pending"), pod("p1", "Pending"), pod("p1", "Running", running=True)):
        api.reads.put(answer)
    t = time.monotonic()
    try:
        backend.watch.start()  # a watch that never says anything about p1
        got = backend._create_and_wait("p1", {"metadata": {"name": "p1"}}, "img", TASK)
    finally:
        backend.watch.stop()
    assert got.status.phase == "Running"
    assert api.calls["read"] == 3
    assert time.monotonic() - t >= 3 * 0.05  # one read per fallback bound, no busy loop


@pytest.mark.timeout(20)
def test_a_pod_deleted_while_starting_is_pod_gone():
    api = StandInPodApi()
    backend = backend_on(api)

    def deleted(name):
        api.event("ADDED", pod(name, "Pending"))
        api.event("DELETED", pod(name, "Pending"))

    api.on_create = deleted
    api.reads.put(client.ApiException(status=404, reason="Not Found"))
    try:
        backend.watch.start()
        with pytest.raises(PodGone, match="p1"):
            backend._create_and_wait("p1", {"metadata": {"name": "p1"}}, "img", TASK)
    finally:
        backend.watch.stop()


@pytest.mark.timeout(20)
def test_an_expired_watch_lists_again_and_follows_on():
    api = StandInPodApi()
    watch = PodWatch(lambda: api, namespace="ns", selector="a=b", fallback_s=5)
    watch.start()
    try:
        api.error(410)  # the server forgot our resource version: list again, watch again
        api.event("ADDED", pod("p2", "Pending"))
        changed, seen, _ = watch.wait("p2", 0, timeout=10)
    finally:
        watch.stop()
    assert changed and seen.status.phase == "Pending"
    assert api.calls["list"] == 2 and api.calls["watch"] == 2


def test_wait_reports_the_latest_state_and_forget_drops_it():
    watch = PodWatch(lambda: None, namespace="ns", selector="a=b", fallback_s=0.01)
    watch.apply({"type": "ADDED", "object": pod("p", "Pending")})
    changed, seen, rev = watch.wait("p", 0, timeout=1)
    assert changed and seen.status.phase == "Pending"
    assert watch.wait("p", rev, timeout=1)[0] is False  # nothing new: the caller reads
    watch.apply({"type": "MODIFIED", "object": pod("p", "Running", running=True)})
    changed, seen, rev2 = watch.wait("p", rev, timeout=1)
    assert changed and seen.status.phase == "Running" and rev2 > rev
    watch.forget("p")
    assert watch.wait("p", 0, timeout=0.01)[:2] == (False, None)
    # a late event about a forgotten pod's deletion leaves nothing behind
    watch.apply({"type": "DELETED", "object": pod("p", "Running")})
    assert "p" not in watch._pods
