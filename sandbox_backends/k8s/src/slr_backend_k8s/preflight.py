"""The k8s backend's preflight: credentials load, the API server answers, the namespace
lets this user list pods, and the image path (containerd socket and ``ctr``, or a
registry) is there. Each failure is the one line the backend itself would raise, before
any sandbox or engine starts."""

from __future__ import annotations

import os
import shutil

from slr.contracts import SandboxError
from slr.preflight import CheckResult, Context, fatal, ok

DOC_API = "docs/troubleshooting/sandboxes.md#kubernetes-api-unreachable"
DOC_IMAGES = "docs/troubleshooting/sandboxes.md#pods-pending"


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
