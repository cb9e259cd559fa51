"""The pods of this process, kept current by one list-and-watch on their labels.

A start used to read its pod every 0.2 s until it ran: at 64 pods starting at once that is
~320 API requests a second, all to learn that nothing changed. ``PodWatch`` holds one watch
(the API's ``?watch=true`` stream over this process's owner labels) for every pod the
backend starts; a start blocks on ``wait`` until an event about its pod arrives.

Bounded fallback: ``wait`` returns with ``changed = False`` after ``fallback_s`` without an
event for the pod, and the caller then reads the pod itself, so a watch that is down or
broke silently costs at most one read per starting pod per ``fallback_s``.
The watch thread re-lists and re-watches after any failure (410 Gone included), with a
backoff of up to ``fallback_s``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger()

WATCH_TIMEOUT_S = 240  # the server ends each watch after this; the thread starts another


class PodWatch:
    """One list-and-watch over the pods matching ``selector`` in ``namespace``.

    ``core`` is a function returning a ``CoreV1Api`` (the backend's, made on first use).
    ``apply`` takes one watch event; the watch thread feeds it, and tests can too.
    """

    def __init__(
        self,
        core: Callable[[], Any],
        *,
        namespace: str,
        selector: str,
        fallback_s: float = 2.0,
    ) -> None:
        self._core = core
        self.namespace = namespace
        self.selector = selector
        self.fallback_s = fallback_s
        self._cond = threading.Condition()
        self._pods: dict[str, Any] = {}
        self._revs: dict[str, int] = {}
        self._rev = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.connected = False
        self.requests = 0  # list and watch calls made (for tests and the bench)

    # -- the watch thread ----------------------------------------------------------------

    def start(self) -> None:
        """Start the watch thread (once; later calls do nothing)."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="slr-k8s-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
        with self._cond:
            self.connected = False
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.1
                self._follow(version)
            except Exception as exc:
                self.connected = False
                if self._stop.is_set():
                    return
                log.debug("pod watch broke; listing again", error=str(exc)[:200])
                # a backoff between reconnects, not a synchronisation: stop() ends it
                self._stop.wait(backoff)
                backoff = min(self.fallback_s, backoff * 2)

    def _list(self) -> str:
        self.requests += 1
        pods = self._core().list_namespaced_pod(
            self.namespace, label_selector=self.selector, _request_timeout=(10, 60)
        )
        with self._cond:
            listed = {p.metadata.name: p for p in pods.items}
            for name in set(self._pods) | set(listed):
                self._set(name, listed.get(name))
            self.connected = True
            self._cond.notify_all()
        return pods.metadata.resource_version

    def _follow(self, version: str) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            self._watch = w = watch.Watch()
            self.requests += 1
            for event in w.stream(
                self._core().list_namespaced_pod,
                self.namespace,
                label_selector=self.selector,
                resource_version=version,
                timeout_seconds=WATCH_TIMEOUT_S,
                _request_timeout=(10, WATCH_TIMEOUT_S + 30),
            ):
                if not isinstance(event, dict):
                    continue  # only a log stream yields lines
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {event.get('raw_object') or event}")
                self.apply(event)
                version = w.resource_version or version
            # the server closed the stream at its timeout: watch on from the last version

    # -- events --------------------------------------------------------------------------

    def apply(self, event: dict[str, Any]) -> None:
        """One watch event (``{"type": ADDED | MODIFIED | DELETED, "object": V1Pod}``)."""
        pod = event["object"]
        name = pod.metadata.name
        with self._cond:
            self._set(name, None if event["type"] == "DELETED" else pod)
            self._cond.notify_all()

    def _set(self, name: str, pod: Any) -> None:
        if pod is None and name not in self._pods:
            return
        if pod is None:
            del self._pods[name]
        else:
            self._pods[name] = pod
        self._rev += 1
        self._revs[name] = self._rev

    # -- waiting -------------------------------------------------------------------------

    def wait(self, name: str, after: int, timeout: float) -> tuple[bool, Any, int]:
        """Block until the pod ``name`` changed since revision ``after``.

        Returns ``(changed, pod, revision)``: ``pod`` is the latest known (``None`` when
        deleted or not seen yet). ``changed`` is False after ``min(timeout, fallback_s)``
        without news (the watch may be down): then read the pod.
        """
        limit = min(timeout, self.fallback_s)
        with self._cond:
            self._cond.wait_for(
                lambda: self._revs.get(name, 0) > after or self._stop.is_set(),
                timeout=limit,
            )
            rev = self._revs.get(name, 0)
            return rev > after, self._pods.get(name), rev

    def forget(self, name: str) -> None:
        """Drop what is known of a pod that is being deleted (keeps the table small)."""
        with self._cond:
            self._pods.pop(name, None)
            self._revs.pop(name, None)
