"""The connection to the API server, and API failures turned into errors a person can act on.

The ``kubernetes`` client is synchronous; the backend calls it from worker threads. Its
``stream()`` helper swaps ``call_api`` on the ApiClient it is given for the length of one
call, which is not safe on a client shared between threads, so each thread streams through
an ApiClient of its own (``KubeApi.stream_core``).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from slr.contracts import SandboxError

# The RBAC rules the backend needs in its namespace; quoted in errors and in the docs.
RBAC_HINT = (
    "the backend needs, in its namespace: pods (create, get, list, watch, delete), "
    "pods/exec (create, get), pods/log (get) and networkpolicies (create, delete, list); "
    "see docs/backends/k8s.md for a Role"
)

REQUEST_TIMEOUT = (10, 60)  # (connect, read) seconds for plain API calls


class K8sError(SandboxError):
    """A sandbox failure that names its Kubernetes cause and the fix."""


class ApiUnreachable(K8sError):
    """The API server could not be reached at all."""


class PermissionDenied(K8sError):
    """RBAC (or authentication) refused a call."""


class QuotaExceeded(K8sError):
    """A ResourceQuota (or LimitRange) refused the pod."""


class ImageUnavailable(K8sError):
    """The task image is not on the node and cannot be pulled."""


class PodStartTimeout(K8sError):
    """The pod did not run within ``pod_start_timeout_s`` (not the agent's timeout)."""


class PodGone(K8sError):
    """The trial's pod was deleted, evicted or killed while the trial used it."""


class KubeApi:
    """Typed API objects over one configuration, plus per-thread clients for exec streams."""

    def __init__(self, *, kubeconfig: str = "", context: str = "") -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if kubeconfig == "in-cluster":
                config.load_incluster_config(client_configuration=cfg)
                self.source = "the in-cluster service account"
            else:
                path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
                path = os.path.expanduser(path.split(os.pathsep)[0])
                if not os.path.exists(path):
                    raise ApiUnreachable(
                        f"no kubeconfig at {path!r} (backend.kubeconfig = {kubeconfig!r}, "
                        f"KUBECONFIG = {os.environ.get('KUBECONFIG')!r}): point KUBECONFIG or "
                        f"backend.kubeconfig at your cluster's kubeconfig, or set "
                        f"backend.kubeconfig = 'in-cluster' when slr runs in a pod"
                    )
                config.load_kube_config(
                    config_file=path, context=context or None, client_configuration=cfg
                )
                self.source = f"kubeconfig {path}"
        except config.ConfigException as exc:
            raise ApiUnreachable(
                f"cannot load the cluster credentials ({kubeconfig or 'KUBECONFIG'}): {exc}. "
                f"Fix backend.kubeconfig / backend.context"
            ) from exc
        # Many trials talk to the server at once; urllib3's default pool of 4 would thrash.
        cfg.connection_pool_maxsize = 64
        cfg.retries = 1
        self.configuration = cfg
        self.host = cfg.host
        self.api_client = client.ApiClient(cfg)
        # Typed Any on purpose: the client's annotations accept model objects only (it takes
        # the plain-dict manifests this backend writes) and make every field of an object read
        # back Optional (the API server always sets a pod's metadata and status).
        self.core: Any = client.CoreV1Api(self.api_client)
        self.networking: Any = client.NetworkingV1Api(self.api_client)
        self._local = threading.local()

    def stream_core(self) -> Any:
        """A CoreV1Api on this thread's own ApiClient, for ``kubernetes.stream.stream``."""
        core = getattr(self._local, "core", None)
        if core is None:
            from kubernetes import client

            core = client.CoreV1Api(client.ApiClient(self.configuration))
            self._local.core = core
        return core

    def server_version(self) -> str:
        from kubernetes import client

        try:
            info = client.VersionApi(self.api_client).get_code(_request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            raise explain(exc, "asking the API server for its version", api=self) from exc
        return info.git_version

    def close(self) -> None:
        self.api_client.close()


def api_message(exc: Any) -> str:
    """The ``message`` of a Kubernetes Status body, else the exception's own text."""
    body = getattr(exc, "body", None)
    if body:
        try:
            return str(json.loads(body).get("message") or body)
        except (ValueError, AttributeError):
            return str(body)
    return str(getattr(exc, "reason", None) or exc)


def is_not_found(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 404


def explain(
    exc: BaseException, doing: str, *, api: KubeApi | None = None, namespace: str = ""
) -> K8sError:
    """One API failure as a ``K8sError`` subclass whose message says what to do next."""
    from kubernetes.client.exceptions import ApiException

    host = api.host if api is not None else "the API server"
    ns = f" in namespace {namespace!r}" if namespace else ""
    if isinstance(exc, K8sError):
        return exc
    status = exc.status if isinstance(exc, ApiException) else None
    if status in (None, 0):
        return ApiUnreachable(
            f"cannot reach the Kubernetes API server at {host} while {doing}: "
            f"{_short(exc)}. Check that the cluster is up and that KUBECONFIG (or "
            f"backend.kubeconfig / backend.context) points at it"
        )
    message = api_message(exc)
    if status == 401:
        return PermissionDenied(
            f"the API server at {host} rejected the credentials while {doing} (401 "
            f"Unauthorized): {message}. Refresh the token in the kubeconfig or pick another "
            f"backend.context"
        )
    if status == 403 and "exceeded quota" in message:
        return QuotaExceeded(
            f"a ResourceQuota{ns} refused the pod while {doing}: {message}. Lower "
            f"backend.max_concurrent_pods or the task's cpus / memory_mb, lower "
            f"backend.request_ratio, or raise the quota"
        )
    if status == 403 and ("LimitRange" in message or "maximum" in message):
        return QuotaExceeded(
            f"a LimitRange{ns} refused the pod while {doing}: {message}. Lower the task's "
            f"cpus / memory_mb or raise the LimitRange"
        )
    if status == 403:
        who = api.source if api is not None else "the configured credentials"
        return PermissionDenied(
            f"permission denied{ns} while {doing} (RBAC, credentials from {who}): {message}. "
            f"Grant the missing rule: {RBAC_HINT}"
        )
    if status == 404 and "namespaces" in message and namespace:
        return K8sError(
            f"namespace {namespace!r} does not exist ({doing}): create it "
            f"(kubectl create namespace {namespace}) or set backend.namespace"
        )
    if status == 404:
        return PodGone(f"not found while {doing}{ns}: {message}")
    if status == 422:
        return K8sError(
            f"the API server rejected the object while {doing}{ns} (422 Invalid): {message}. "
            f"Check the backend options (labels, tolerations, node_selector) it names"
        )
    return K8sError(f"Kubernetes API error {status} while {doing}{ns}: {message}")


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc)
    # urllib3 wraps the socket error several levels deep; the last part names it.
    for marker in ("Failed to establish a new connection: ", "NewConnectionError"):
        if marker in text:
            text = text.split(marker, 1)[1]
    return text.strip(" :'\")(")[:300]
