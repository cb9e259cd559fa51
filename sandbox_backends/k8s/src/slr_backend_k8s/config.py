"""``[backend]`` options of the k8s backend (``name = "k8s"``). Imported without the SDK."""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option

ImageLoad = Literal["containerd", "registry", "none"]
PullPolicy = Literal["", "Never", "IfNotPresent", "Always"]


@frozen(kw_only=True)
class K8sBackendConfig:
    # -- where ---------------------------------------------------------------------------
    kubeconfig: str = option(
        "",
        doc="Path of the kubeconfig file; '' reads $KUBECONFIG (else ~/.kube/config); "
        "'in-cluster' uses the service account of the pod slr itself runs in.",
    )
    context: str = option("", doc="kubeconfig context to use; '' is its current context.")
    namespace: str = option("default", doc="Namespace the trial pods are created in.")
    # -- the pods ------------------------------------------------------------------------
    node_selector: dict[str, str] = option(
        factory=dict, doc="Node labels a trial pod must be scheduled on (nodeSelector)."
    )
    tolerations: list[dict[str, str | int]] = option(
        factory=list,
        doc="Pod tolerations, as in a pod spec: [{key, operator, value, effect, "
        "tolerationSeconds}].",
    )
    service_account: str = option(
        "",
        doc="Service account of the trial pods ('' = the namespace default). Its token is "
        "never mounted: agents get no cluster credentials.",
    )
    image_pull_secrets: list[str] = option(
        factory=list, doc="Names of docker-registry secrets the pods pull task images with."
    )
    runtime_class: str = option(
        "", doc="RuntimeClass of the pods (e.g. 'gvisor' or 'kata' for stronger isolation)."
    )
    priority_class: str = option("", doc="PriorityClass of the pods ('' = the cluster default).")
    labels: dict[str, str] = option(factory=dict, doc="Extra labels put on every trial pod.")
    annotations: dict[str, str] = option(
        factory=dict, doc="Extra annotations put on every trial pod."
    )
    request_ratio: float = option(
        1.0,
        doc="Resource requests = the task's cpu/memory limits times this. Below 1 overcommits "
        "a node (dev clusters, benchmarks); 1 gives each trial what its task.toml asks for.",
        validator=[validators.gt(0.0), validators.le(1.0)],
    )
    limit_storage: bool = option(
        True, doc="Put the task's storage_mb on the pod as an ephemeral-storage limit."
    )
    # -- timing and concurrency ----------------------------------------------------------
    open_files: int = option(
        4096,
        doc="Most files one process of a sandbox may hold open (an rlimit set on every exec; "
        "the task's storage_mb bounds one file's size the same way).",
    )
    pod_start_timeout_s: float = option(
        180.0,
        doc="Most seconds from pod creation to its container running (scheduling, image "
        "pull, start). Separate from the agent's timeout: running past it is a sandbox_error.",
        validator=validators.gt(0.0),
    )
    watch_fallback_s: float = option(
        2.0,
        doc="A starting pod is followed by one watch over this process's pods; with no event "
        "about it for this many seconds (a watch that broke), the pod is read directly.",
        validator=validators.gt(0.0),
    )
    active_deadline_s: int = option(
        0,
        doc="activeDeadlineSeconds of each pod: Kubernetes kills it after this even if slr "
        "died. 0 = the task's agent + verifier timeouts + 600 s.",
        validator=validators.ge(0),
    )
    max_concurrent_pods: int = option(
        16,
        doc="Most trial pods this process keeps at once; further starts wait for a slot.",
        validator=validators.ge(1),
    )
    # -- images --------------------------------------------------------------------------
    image_load: ImageLoad = option(
        "containerd",
        doc="How the task image (built by the docker backend's builder) reaches the nodes: "
        "'containerd' imports it into a single node's containerd (`docker save | ctr "
        "import`, like `kind load`; dev clusters); 'registry' pushes it to `registry` and "
        "pods pull it; 'none' builds nothing and uses images already on the nodes or in a "
        "registry (environment.docker_image).",
    )
    registry: str = option(
        "",
        doc="Repository prefix images are pushed to with image_load = 'registry' "
        "(e.g. 'registry.example.com/slr').",
    )
    containerd_address: str = option(
        "",
        doc="containerd socket of the node for image_load = 'containerd'; '' reads "
        "$CONTAINERD_ADDRESS, else /run/containerd/containerd.sock.",
    )
    containerd_namespace: str = option(
        "k8s.io", doc="containerd namespace the kubelet's images live in."
    )
    ctr: str = option("ctr", doc="The containerd CLI used to import images.")
    image_pull_policy: PullPolicy = option(
        "",
        doc="imagePullPolicy of the pods; '' = 'Never' for image_load = 'containerd' (a "
        "missing image fails at once), 'IfNotPresent' otherwise.",
    )
    docker_url: str | None = option(
        None, doc="Docker daemon that builds the task images; default: DOCKER_HOST."
    )
    # -- networking ----------------------------------------------------------------------
    network: Literal["loopback", "policy"] = option(
        "loopback",
        doc="How the agent phase is fenced in. 'loopback': an init container (task image, "
        "NET_ADMIN) deletes the pod's interfaces but lo, and the proxy is reached through a "
        "unix socket on a hostPath, relayed to 127.0.0.1 inside the pod (single-node clusters "
        "where this machine is the node; needs python3 in the image). 'policy': the pod keeps "
        "its network and a NetworkPolicy allows egress only to the proxy (any cluster whose "
        "CNI enforces NetworkPolicy).",
    )
    link_port: int = option(
        47110,
        doc="network = 'loopback': port on the pod's loopback where the agent reaches the proxy.",
        validator=[validators.ge(1), validators.le(65535)],
    )
    link_dir: str | None = option(
        None,
        doc="network = 'loopback': host folder for the per-trial proxy sockets (must be on "
        "the node); default: a temporary folder.",
    )
    proxy_host: str = option(
        "gateway",
        doc="network = 'policy': address the pods dial to reach slr's proxy: 'gateway' = the pod network's "
        "gateway on the node (this machine, on a single-node dev cluster), or an IP / DNS "
        "name (node IP, Service, the slr pod's IP).",
    )
    proxy_port: int = option(
        0,
        doc="Port the pods dial; 0 = a free port when proxy_forward is on, else the proxy's.",
        validator=[validators.ge(0), validators.le(65535)],
    )
    proxy_forward: bool = option(
        True,
        doc="Listen on proxy_host:proxy_port on this machine and forward to the proxy (which "
        "binds loopback by default). Off when proxy_host already reaches the proxy itself.",
    )
    network_policy: bool = option(
        True,
        doc="network = 'policy': create a NetworkPolicy per pod: no ingress, egress only to "
        "the proxy during the agent phase. Needs a CNI that enforces NetworkPolicy; others "
        "ignore it silently.",
    )
    # -- agent bundles -------------------------------------------------------------------
    bundle_mode: Literal["hostPath", "image"] = option(
        "hostPath",
        doc="How agent runtime bundles reach the pods: 'hostPath' mounts the host folder "
        "read-only (single-node clusters, where this machine is the node); 'image' copies "
        "them from `bundle_images` with an init container (any cluster).",
    )
    bundle_images: dict[str, str] = option(
        factory=dict,
        doc="For bundle_mode = 'image': in-sandbox mount path -> image that holds the bundle "
        "at that same path.",
    )
    keep_pods: bool = option(
        False,
        doc="Leave pods behind after a trial (debugging only; they still hit their deadline).",
    )
