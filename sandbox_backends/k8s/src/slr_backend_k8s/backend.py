"""The k8s backend: one pod per trial, created from the task's image, deleted at once after.

Pods carry labels naming this host and process; a run that starts cleans up the pods of
dead processes on its host, and every pod has an ``activeDeadlineSeconds`` so the cluster
ends it even when no slr process ever comes back. See docs/backends/k8s.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from slr.contracts import SandboxError
from slr.sandboxing import ProxyLink, pid_alive, remove_stale_links
from slr.sandboxing.labels import OWNER_HOST, OWNER_PID, OWNER_START, SANDBOX
from slr.sandboxing.relay import READY
from slr_backend_k8s.api import (
    REQUEST_TIMEOUT,
    ImageUnavailable,
    K8sError,
    KubeApi,
    PodStartTimeout,
    api_message,
    explain,
    is_not_found,
)
from slr_backend_k8s.config import K8sBackendConfig
from slr_backend_k8s.forward import local_address_towards
from slr_backend_k8s.images import ImageLoader
from slr_backend_k8s.podspec import (
    CONTAINER,
    LABEL_POD,
    SANDBOX_KIND,
    label_value,
    network_policy,
    owner_labels,
    pod_labels,
    pod_manifest,
    pod_name,
    process_start_time,
)
from slr_backend_k8s.sandbox import K8sSandbox, PodAccess
from slr_backend_k8s.watch import PodWatch

log = structlog.get_logger()

# Container states that will not fix themselves: fail the start at once, not at the timeout.
_IMAGE_REASONS = {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
_FATAL_REASONS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
_RELAY_POLL_S = 0.2  # the pod runs; its relay's "ready" line is only in its log


class K8sBackend:
    """``SandboxBackend`` on a Kubernetes cluster (kubeconfig or in-cluster credentials)."""

    def __init__(self, config: K8sBackendConfig | None = None) -> None:
        self.config = config or K8sBackendConfig()
        self.images = ImageLoader(self.config)
        self._api: KubeApi | None = None
        self._api_lock = threading.Lock()
        # Each exec holds a thread for its whole run; size the pool for every pod's agent,
        # its kill-tree exec and a start in flight.
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max(32, 4 * self.config.max_concurrent_pods + 8), thread_name_prefix="slr-k8s"
        )
        self._slots = threading.BoundedSemaphore(self.config.max_concurrent_pods)
        self._live: dict[str, K8sSandbox] = {}
        self._live_lock = threading.Lock()
        # every pod this process starts, watched by its owner labels (slr_backend_k8s.watch)
        owner = owner_labels()
        self.watch = PodWatch(
            lambda: self.api.core,
            namespace=self.config.namespace,
            selector=",".join(f"{k}={owner[k]}" for k in (SANDBOX, OWNER_HOST, OWNER_PID)),
            fallback_s=self.config.watch_fallback_s,
        )

    # -- plumbing ------------------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        """The API connection, made (and checked with one version call) on first use."""
        with self._api_lock:
            if self._api is None:
                api = KubeApi(kubeconfig=self.config.kubeconfig, context=self.config.context)
                version = api.server_version()
                log.info("connected to Kubernetes", server=api.host, version=version)
                self._api = api
            return self._api

    async def call(self, fn, *args, **kwargs):
        """Run a blocking function on the backend's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    # -- images --------------------------------------------------------------------------

    async def prepare(self, task: Any) -> None:
        """Build the task image (docker backend's builder) and make it reach the node(s)."""
        await self.images.prepare(task, self.call)

    # -- sandboxes -----------------------------------------------------------------------

    async def start(
        self,
        task: Any,
        *,
        trial_id: str,
        labels: Mapping[str, str],
        mounts: Mapping[Path, str] | None = None,
    ) -> K8sSandbox:
        await self.call(lambda: self.api)  # connect (and fail clearly) before building
        await self.prepare(task)
        image = self.images.pod_image(task)
        cancelled = threading.Event()
        try:
            await asyncio.shield(self.call(self._acquire_slot, cancelled))
        except asyncio.CancelledError:
            cancelled.set()
            raise
        name = pod_name(task.id)
        on_pod, annotations = pod_labels(task.id, trial_id, labels)
        link = None
        try:
            if self.loopback:
                link = ProxyLink(parent=self.config.link_dir)
                link.start()
            manifest = pod_manifest(
                name=name,
                task=task,
                image=image,
                pull_policy=self.images.pull_policy,
                config=self.config,
                labels=on_pod,
                annotations=annotations,
                mounts=mounts or {},
                link_dir=str(link.dir) if link is not None else None,
            )
        except (ValueError, OSError) as exc:
            self._slots.release()
            if link is not None:
                link.remove()
            raise SandboxError(f"cannot prepare pod {name} for task {task.id}: {exc}") from exc
        self.watch.start()
        job = self.pool.submit(self._create_and_wait, name, manifest, image, task)
        try:
            pod = await asyncio.shield(asyncio.wrap_future(job))
        except asyncio.CancelledError:
            # The pod may be created after this point: delete whatever the job left, and
            # before the cancel returns, so that whoever cancels a start (the warm pool's
            # drain at the end of a run) finds nothing of it left. Cancelled again while
            # waiting, the clean-up still runs in its thread.
            cleanup = self.pool.submit(self._abandon_after, job, name, link)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(asyncio.wrap_future(cleanup))
            raise
        except BaseException:
            await self.call(self._abandon, name, link)
            raise
        sandbox = K8sSandbox(
            access=self._access(),
            name=name,
            labels={**on_pod, LABEL_POD: name},
            pod_ip=pod.status.pod_ip or "",
            node=pod.spec.node_name or "",
            proxy_host=None if self.loopback else self._proxy_host(pod.status.pod_ip),
            link=link,
            open_files=self.config.open_files,
            file_size_mb=task.environment.storage_mb,
        )
        with self._live_lock:
            self._live[name] = sandbox
        if self.uses_policy:
            try:
                await self.call(self._create_policy, sandbox)
            except BaseException:
                await sandbox.stop()
                raise
        return sandbox

    def _access(self) -> PodAccess:
        return PodAccess(
            api=self.api,
            config=self.config,
            call=self.call,
            pod_problem=self.pod_problem,
            release=self.release,
            uses_policy=self.uses_policy,
        )

    @property
    def loopback(self) -> bool:
        return self.config.network == "loopback"

    @property
    def uses_policy(self) -> bool:
        return self.config.network == "policy" and self.config.network_policy

    def _acquire_slot(self, cancelled: threading.Event) -> None:
        while not self._slots.acquire(timeout=0.25):
            if cancelled.is_set():
                return
        if cancelled.is_set():
            self._slots.release()

    def _proxy_host(self, pod_ip: str | None) -> str | None:
        if self.config.proxy_host != "gateway":
            return self.config.proxy_host
        if not pod_ip:
            return None
        return local_address_towards(pod_ip)

    def _create_and_wait(self, name: str, manifest: dict, image: str, task: Any) -> Any:
        ns = self.config.namespace
        core = self.api.core
        try:
            core.create_namespaced_pod(ns, manifest, _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            raise explain(exc, f"creating pod {name}", api=self.api, namespace=ns) from exc
        started = time.monotonic()
        deadline = started + self.config.pod_start_timeout_s
        watch = self.watch
        pod, rev, running = None, 0, False
        while (left := deadline - time.monotonic()) > 0:
            # Running but the relay not listening yet: its log has no event, look again soon.
            changed, seen, rev = watch.wait(name, rev, _RELAY_POLL_S if running else left)
            if changed and seen is not None:
                pod = seen
            elif changed or not running:
                # deleted (reads as 404: PodGone), or no news within the fallback bound
                # (the watch may be down): read the pod itself
                try:
                    pod = core.read_namespaced_pod(name, ns, _request_timeout=REQUEST_TIMEOUT)
                except Exception as exc:
                    raise explain(
                        exc, f"waiting for pod {name}", api=self.api, namespace=ns
                    ) from exc
            assert pod is not None  # seen or read above; only a running pod skips both
            running = pod.status.phase == "Running" and _container_running(pod)
            if running and (not self.loopback or self._relay_ready(name)):
                log.debug("pod ready", pod=name, seconds=round(time.monotonic() - started, 2))
                return pod
            self._fail_fast(pod, image, task)
        raise PodStartTimeout(
            f"pod {name} for task {task.id} was not running after "
            f"backend.pod_start_timeout_s = {self.config.pod_start_timeout_s:g}s "
            f"(this is the sandbox start, not the agent's timeout): {self._why_pending(pod)}. "
            f"Check that a node matches backend.node_selector / tolerations and has room "
            f"(kubectl describe pod), lower backend.request_ratio or max_concurrent_pods, or "
            f"raise pod_start_timeout_s"
        )

    def _relay_ready(self, name: str) -> bool:
        """Whether the in-pod relay listens yet (the first exec may dial the proxy)."""
        try:
            out = self.api.core.read_namespaced_pod_log(
                name, self.config.namespace, container=CONTAINER, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            raise explain(exc, f"reading the log of pod {name}", api=self.api) from exc
        return READY in (out or "")

    def _fail_fast(self, pod: Any, image: str, task: Any) -> None:
        name = pod.metadata.name
        for status in (pod.status.init_container_statuses or []) + (
            pod.status.container_statuses or []
        ):
            waiting = status.state.waiting if status.state else None
            if waiting and waiting.reason in _IMAGE_REASONS:
                how = (
                    "load it into the node's containerd (backend.image_load = 'containerd', "
                    f"containerd_address = {self.images.containerd_address!r})"
                    if self.images.pull_policy == "Never"
                    else "push it to a registry the nodes can pull from (image_load = "
                    "'registry'), and give the pods image_pull_secrets if it is private"
                )
                raise ImageUnavailable(
                    f"pod {name} cannot get image {status.image!r} for task {task.id} "
                    f"({waiting.reason}: {waiting.message or ''}). The image is not on node "
                    f"{pod.spec.node_name} and imagePullPolicy is "
                    f"{self.images.pull_policy}: {how}"
                )
            if waiting and waiting.reason in _FATAL_REASONS:
                raise K8sError(
                    f"pod {name} for task {task.id} cannot start its container "
                    f"({waiting.reason}): {waiting.message}"
                )
            terminated = status.state.terminated if status.state else None
            if terminated is not None and terminated.exit_code != 0:
                hint = (
                    " network = 'loopback' needs python3 in the task image and NET_ADMIN for "
                    "its init container (or use network = 'policy')."
                    if self.loopback
                    else " The task image needs /bin/sh."
                )
                raise K8sError(
                    f"container {status.name} of pod {name} (task {task.id}) failed at start "
                    f"({terminated.reason}, exit {terminated.exit_code}): "
                    f"{(terminated.message or '').strip()}{self._log_tail(name, status.name)}.{hint}"
                )
        for status in pod.status.container_statuses or []:
            terminated = status.state.terminated if status.state else None
            if terminated is not None:
                raise K8sError(
                    f"the container of pod {name} (task {task.id}) exited at start "
                    f"({terminated.reason}, exit {terminated.exit_code})"
                    f"{self._log_tail(name, status.name)}"
                )
        if pod.status.phase in ("Failed", "Succeeded"):
            raise K8sError(
                f"pod {name} for task {task.id} ended before it ran ({pod.status.phase}: "
                f"{pod.status.reason or ''} {pod.status.message or ''})"
            )

    def _log_tail(self, name: str, container: str) -> str:
        try:
            out = self.api.core.read_namespaced_pod_log(
                name,
                self.config.namespace,
                container=container,
                tail_lines=20,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception:
            return ""
        return f" (log: {out.strip()[-600:]})" if out and out.strip() else ""

    def _why_pending(self, pod: Any) -> str:
        if pod is None:
            return "never read back"
        parts = [f"phase {pod.status.phase}"]
        for cond in pod.status.conditions or []:
            if cond.status != "True" and cond.message:
                parts.append(f"{cond.type}: {cond.reason} {cond.message}")
        for status in pod.status.container_statuses or []:
            if status.state and status.state.waiting:
                w = status.state.waiting
                parts.append(f"container {w.reason} {w.message or ''}".strip())
        return "; ".join(parts)

    def _create_policy(self, sandbox: K8sSandbox) -> None:
        body = network_policy(
            name=sandbox.name,
            labels=sandbox.labels,
            proxy_ip=sandbox.proxy_host if _is_ip(sandbox.proxy_host) else None,
            proxy_port=None if self.config.proxy_forward else (self.config.proxy_port or None),
        )
        try:
            self.api.networking.create_namespaced_network_policy(
                self.config.namespace, body, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            raise explain(
                exc,
                f"creating the NetworkPolicy of pod {sandbox.name} (set backend.network_policy "
                f"= false where the cluster has no NetworkPolicy support)",
                api=self.api,
                namespace=self.config.namespace,
            ) from exc

    def pod_problem(self, name: str) -> str:
        """'' while the pod runs; otherwise what happened to it, in words."""
        try:
            pod = self.api.core.read_namespaced_pod(
                name, self.config.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            if is_not_found(exc):
                return "was deleted while the trial used it"
            return f"could not be checked ({api_message(exc)})"
        if pod.metadata.deletion_timestamp is not None:
            return "is being deleted"
        if pod.status.phase != "Running" or not _container_running(pod):
            why = pod.status.reason or ""
            if why == "DeadlineExceeded":
                why += " (backend.active_deadline_s)"
            for status in pod.status.container_statuses or []:
                t = status.state.terminated if status.state else None
                if t is not None:
                    why += f" container {t.reason} exit {t.exit_code}"
            return f"stopped running ({pod.status.phase} {why.strip()})"
        return ""

    async def release(self, name: str) -> None:
        """Delete a sandbox's pod and policy and free its slot (``K8sSandbox.stop``)."""
        with self._live_lock:
            known = self._live.pop(name, None) is not None
        try:
            if not self.config.keep_pods:
                await self.call(self._delete, name)
        finally:
            if known:
                self._slots.release()

    def _delete(self, name: str) -> None:
        ns = self.config.namespace
        self.watch.forget(name)
        for attempt in range(3):
            try:
                self.api.core.delete_namespaced_pod(
                    name, ns, grace_period_seconds=0, _request_timeout=REQUEST_TIMEOUT
                )
                break
            except Exception as exc:
                if is_not_found(exc):
                    break
                if attempt == 2:
                    log.error(
                        "could not delete a trial pod; the next start's orphan clean-up (or "
                        "its activeDeadlineSeconds) will remove it",
                        pod=name,
                        error=str(explain(exc, "deleting a pod", api=self.api, namespace=ns)),
                    )
                    return
                time.sleep(0.5 * (attempt + 1))
        if self.uses_policy:
            try:
                self.api.networking.delete_namespaced_network_policy(
                    name, ns, _request_timeout=REQUEST_TIMEOUT
                )
            except Exception as exc:
                if not is_not_found(exc):
                    log.warning("could not delete a NetworkPolicy", name=name, error=str(exc))

    def _abandon_after(
        self, job: concurrent.futures.Future, name: str, link: ProxyLink | None
    ) -> None:
        """``_abandon`` once the start's job has ended (submitted after it: the pool's
        queue runs it first)."""
        with contextlib.suppress(BaseException):
            job.result()
        self._abandon(name, link)

    def _abandon(self, name: str, link: ProxyLink | None = None) -> None:
        """A start failed or was cancelled: delete what it made and free its slot."""
        try:
            self._delete(name)
        except Exception as exc:  # cleanup after another failure: report, do not mask it
            log.warning("could not delete a failed pod", pod=name, error=str(exc))
        finally:
            if link is not None:
                link.remove()
            self._slots.release()

    # -- orphans -------------------------------------------------------------------------

    async def cleanup_orphans(self) -> int:
        """Delete pods of dead slr processes on this host, and any ended slr pod; count them."""
        return await self.call(self._cleanup_orphans)

    def _cleanup_orphans(self) -> int:
        ns = self.config.namespace
        host = label_value(socket.gethostname()) or "unknown"
        selector = f"{SANDBOX}={SANDBOX_KIND}"
        try:
            pods = self.api.core.list_namespaced_pod(
                ns, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
            ).items
        except Exception as exc:
            raise explain(exc, "listing trial pods", api=self.api, namespace=ns) from exc
        removed = 0
        for pod in pods:
            labels = pod.metadata.labels or {}
            ended = pod.status.phase in ("Failed", "Succeeded")
            mine = labels.get(OWNER_HOST) == host
            if not ended and not (mine and not _owner_alive(labels)):
                continue
            self._delete(pod.metadata.name)
            removed += 1
            log.info("removed orphaned trial pod", pod=pod.metadata.name, phase=pod.status.phase)
        try:
            policies = self.api.networking.list_namespaced_network_policy(
                ns, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
            ).items
        except Exception:
            policies = []  # no NetworkPolicy permission is reported where policies are made
        if policies:
            current = {p.metadata.name for p in self._list_pods(selector)}
            for policy in policies:
                if policy.metadata.name not in current:
                    self._delete_policy_quietly(policy.metadata.name)
        if self.loopback:
            links = remove_stale_links(self.config.link_dir)
            if links:
                log.info("removed proxy link folders of dead processes", count=links)
        return removed

    def _list_pods(self, selector: str) -> list[Any]:
        return self.api.core.list_namespaced_pod(
            self.config.namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
        ).items

    def _delete_policy_quietly(self, name: str) -> None:
        try:
            self.api.networking.delete_namespaced_network_policy(
                name, self.config.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            if not is_not_found(exc):
                log.warning("could not delete a NetworkPolicy", name=name, error=str(exc))

    def list_pods(self, **labels: str) -> list[Any]:
        """Pods of this backend matching ``labels`` (tests, tooling)."""
        selector = ",".join([f"{SANDBOX}={SANDBOX_KIND}"] + [f"{k}={v}" for k, v in labels.items()])
        return self._list_pods(selector)

    async def close(self) -> None:
        """Stop every sandbox still open, then release the connection."""
        with self._live_lock:
            live = list(self._live.values())
        for sandbox in live:
            try:
                await sandbox.stop()
            except SandboxError as exc:
                log.warning("could not stop a sandbox at close", pod=sandbox.name, error=str(exc))
        await self.images.close()
        self.watch.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self._api is not None:
            self._api.close()
            self._api = None


def _container_running(pod: Any) -> bool:
    for status in pod.status.container_statuses or []:
        if status.name == CONTAINER:
            return bool(status.state and status.state.running)
    return False


def _owner_alive(labels: Mapping[str, str]) -> bool:
    pid = labels.get(OWNER_PID, "")
    if not pid.isdigit() or not pid_alive(int(pid)):
        return False
    # A reused PID belongs to a different process: compare the kernel's start times.
    start = labels.get(OWNER_START, "")
    return not start or start == "0" or process_start_time(int(pid)) == start


def _is_ip(host: str | None) -> bool:
    if not host:
        return False
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True
