"""The k8s backend's preflight: credentials load, the API server answers, the namespace
lets this user list pods, the image path (containerd socket and ``ctr``, or a registry) is
there, and the nodes give pods a process limit. Each failure is the one line the backend
itself would raise, before any sandbox or engine starts."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from slr.contracts import SandboxError
from slr.preflight import CheckResult, Context, fatal, ok, warn

DOC_API = "docs/troubleshooting/sandboxes.md#kubernetes-api-unreachable"
DOC_IMAGES = "docs/troubleshooting/sandboxes.md#pods-pending"
DOC_PIDS = "docs/troubleshooting/sandboxes.md#pods-without-a-process-limit"
# The kubelet setting that bounds the processes of one pod (a pod spec has no field for it).
PIDS_SETTING = "podPidsLimit"
PIDS_FIX = (
    f"set {PIDS_SETTING} in the kubelet configuration (KubeletConfiguration, e.g. "
    f"{PIDS_SETTING}: 4096; or kubelet --pod-max-pids) on every node trial pods run on"
)
MAX_NODES_ASKED = 20  # a kubelet's configuration is one request per node: ask this many


def check_config(ctx: Context) -> CheckResult | None:
    if not ctx.uses("backend", "k8s"):
        return None
    options = ctx.options("backend")
    if options.image_load == "registry" and not options.registry:
        return fatal(
            "backend.image_load = 'registry' but backend.registry is empty",
            fix="set backend.registry (e.g. 'registry.example.com/slr') to push task images to",
        )
    return ok(f"image_load = {options.image_load!r}, network = {options.network!r}")


def check_api(ctx: Context) -> CheckResult | None:
    if not ctx.uses("backend", "k8s"):
        return None
    from slr_backend_k8s.api import REQUEST_TIMEOUT, KubeApi, explain

    options = ctx.options("backend")
    try:
        api = KubeApi(kubeconfig=options.kubeconfig, context=options.context)
        try:
            version = api.server_version()
            try:
                api.core.list_namespaced_pod(
                    options.namespace, limit=1, _request_timeout=REQUEST_TIMEOUT
                )
            except Exception as exc:
                raise explain(exc, "listing pods", api=api, namespace=options.namespace) from exc
        finally:
            api.close()
    except SandboxError as exc:
        return fatal(
            str(exc),
            fix=f"`kubectl get pods -n {options.namespace}` with the same kubeconfig must work",
            doc=DOC_API,
        )
    return ok(
        f"Kubernetes {version} at {api.host} ({api.source}); pods in {options.namespace!r} listable"
    )


def check_images(ctx: Context) -> CheckResult | None:
    if not ctx.uses("backend", "k8s"):
        return None
    options = ctx.options("backend")
    if options.image_load != "containerd":
        return None
    from slr_backend_k8s.images import DEFAULT_CONTAINERD

    address = (
        options.containerd_address or os.environ.get("CONTAINERD_ADDRESS") or DEFAULT_CONTAINERD
    )
    if not os.path.exists(address):
        return fatal(
            f"image_load = 'containerd' but there is no containerd socket at {address!r}",
            fix="set backend.containerd_address (or CONTAINERD_ADDRESS) to the node's "
            "containerd socket; on a multi-node cluster use image_load = 'registry'",
            doc=DOC_IMAGES,
        )
    if shutil.which(options.ctr) is None:
        return fatal(
            f"the containerd CLI {options.ctr!r} is not installed",
            fix="install containerd's ctr (apt-get install containerd) or set backend.ctr",
            doc=DOC_IMAGES,
        )
    return ok(f"containerd socket {address} and {options.ctr} present")


def check_pids(ctx: Context) -> CheckResult | None:
    """The kubelet's ``podPidsLimit`` on the nodes trial pods may land on: without it a
    fork bomb in one sandbox takes the whole node's PIDs (no pod field can bound it)."""
    if not ctx.uses("backend", "k8s"):
        return None
    from slr_backend_k8s.api import ApiUnreachable, KubeApi

    options = ctx.options("backend")
    try:
        api = KubeApi(kubeconfig=options.kubeconfig, context=options.context)
    except ApiUnreachable:
        return None  # k8s-api reports it
    try:
        nodes, limits = node_pids_limits(api, options.node_selector)
    except NodeUnreadable as exc:
        return warn(
            f"cannot tell whether trial pods get a process limit ({exc})",
            fix=f"grant get/list on nodes and get on nodes/proxy to check it here, and make "
            f"sure the cluster sets it: {PIDS_FIX}",
            doc=DOC_PIDS,
        )
    finally:
        api.close()
    selector = ",".join(f"{k}={v}" for k, v in options.node_selector.items())
    where = f" matching node_selector {selector!r}" if selector else ""
    if not limits:
        return warn(
            f"no node{where}: cannot tell whether trial pods get a process limit",
            fix="check backend.node_selector",
        )
    unlimited = [name for name, limit in limits.items() if limit is None]
    if unlimited:
        return warn(
            f"{len(unlimited)} of {len(limits)} nodes{where} run pods with no process limit "
            f"(kubelet {PIDS_SETTING} unset: {', '.join(unlimited[:5])}): a fork bomb in one "
            f"sandbox can use up the node's PIDs and stall every other pod on it",
            fix=PIDS_FIX,
            doc=DOC_PIDS,
        )
    asked = f"the first {len(limits)} of {nodes}" if nodes > len(limits) else f"all {nodes}"
    lowest = min(v for v in limits.values() if v is not None)
    return ok(f"pods are limited to {lowest} processes ({PIDS_SETTING}) on {asked} node(s){where}")


class NodeUnreadable(Exception):
    """The nodes, or a kubelet's configuration, could not be read (RBAC, most often)."""


def node_pids_limits(
    api: Any, node_selector: dict[str, str], *, most: int = MAX_NODES_ASKED
) -> tuple[int, dict[str, int | None]]:
    """(how many nodes match ``node_selector``, the ``podPidsLimit`` of the first ``most``
    of them by name: None where the kubelet sets none), read from each kubelet's /configz
    through the API server (``nodes/proxy``)."""
    from slr_backend_k8s.api import REQUEST_TIMEOUT, api_message

    def unreadable(exc: BaseException, doing: str) -> NodeUnreadable:
        status = getattr(exc, "status", None)
        why = f"{status} {api_message(exc)}" if status else str(exc)
        return NodeUnreadable(f"{doing}: {why[:200]}")

    selector = ",".join(f"{k}={v}" for k, v in node_selector.items())
    try:
        listed = api.core.list_node(label_selector=selector, _request_timeout=REQUEST_TIMEOUT)
    except Exception as exc:
        raise unreadable(exc, "listing the nodes") from exc
    names = sorted(n.metadata.name for n in listed.items)
    limits: dict[str, int | None] = {}
    for name in names[:most]:
        try:
            reply = api.core.connect_get_node_proxy_with_path(
                name, "configz", _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            limits[name] = pod_pids_limit(json.loads(reply.data))
        except Exception as exc:
            raise unreadable(exc, f"reading the kubelet configuration of node {name!r}") from exc
    return len(names), limits


def pod_pids_limit(configz: Any) -> int | None:
    """The ``podPidsLimit`` of a kubelet's ``/configz`` answer; None when pods have none
    (unset, -1 or 0: the kubelet then leaves the pod's ``pids.max`` at ``max``)."""
    config = configz.get("kubeletconfig", configz) if isinstance(configz, dict) else {}
    value = config.get(PIDS_SETTING) if isinstance(config, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
