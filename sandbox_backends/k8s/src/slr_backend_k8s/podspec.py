"""The objects one trial creates: its pod and its NetworkPolicy, as plain manifests.

Pure functions of the task, the backend config and the trial; no API calls here, so they
are unit-tested without a cluster.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slr.sandboxing.labels import OWNER_HOST, OWNER_PID, OWNER_START, SANDBOX, trial_labels
from slr_backend_k8s.config import K8sBackendConfig

CONTAINER = "sandbox"
BUNDLE_SCRATCH = "/slr-bundle"

# The label keys every backend shares are ``slr.sandboxing.labels``; these are this backend's
# own. ``LABEL_POD`` (the pod's name) is what a trial's NetworkPolicy selects.
LABEL_POD = "slr.pod"
ANNOTATION_LABELS = "slr.dev/labels"
SANDBOX_KIND = "k8s"  # the value of ``labels.SANDBOX``: orphan clean-up selects on it

# The container's main process: blocks reading its stdin (kept open, never written), so it
# has no child of its own for a test or an agent to trip over (``pgrep sleep``). PID 1 is the
# pod's pause process (shareProcessNamespace), which reaps re-parented orphans. ``IDLE_TAG``
# in its argv lets ``end_processes`` spare it.
IDLE_TAG = "slr-idle"
IDLE_COMMAND = [
    "sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do read -r _ || sleep 1; done",
    IDLE_TAG,
]

# network = "loopback": the proxy link folder (relay.py + proxy.sock) is mounted here, and the
# relay is the container's main process (its argv holds RELAY_TAG).
LINK_MOUNT = "/run/slr"
RELAY_TAG = f"{LINK_MOUNT}/relay.py"

# Init container of network = "loopback" (runs with NET_ADMIN, which the sandbox itself never
# gets): delete every interface of the pod's network namespace but lo, over rtnetlink.
DROP_INTERFACES = r"""
import os, socket, struct
names = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:] if ":" in l]
for name in names:
    if name == "lo":
        continue
    index = socket.if_nametoindex(name)
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    body = struct.pack("BxHiII", socket.AF_UNSPEC, 0, index, 0, 0)
    s.send(struct.pack("IHHII", 16 + len(body), 17, 1 | 4, 1, 0) + body)  # RTM_DELLINK, REQUEST|ACK
    err = struct.unpack("i", s.recv(4096)[16:20])[0]
    if err:
        raise OSError(-err, os.strerror(-err), name)
    print("removed", name)
"""

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


def label_value(value: object) -> str:
    """Any text as a valid label value: at most 63 of [A-Za-z0-9._-], alphanumeric ends."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", str(value))[:63]
    return text.strip("._-")


def valid_label_key(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and not _DNS_SUBDOMAIN.match(prefix):
        return False
    return bool(_LABEL_NAME.match(name))


def dns_label(text: str, limit: int) -> str:
    """Lower-case DNS-1123 label text (pod names), at most ``limit`` characters."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:limit].strip("-")
    return out or "task"


def pod_name(task_id: str) -> str:
    return f"slr-{dns_label(task_id, 40)}-{uuid.uuid4().hex[:10]}"


def process_start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (clock ticks since boot): tells a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; fields after its ')' are fixed.
    return stat.rsplit(")", 1)[1].split()[19]


def owner_labels() -> dict[str, str]:
    """Who made a pod: this host and process. Orphan clean-up checks the process is gone."""
    pid = os.getpid()
    return {
        SANDBOX: SANDBOX_KIND,
        OWNER_HOST: label_value(socket.gethostname()) or "unknown",
        OWNER_PID: str(pid),
        OWNER_START: process_start_time(pid) or "0",
    }


def pod_labels(
    task_id: str, trial_id: str, labels: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) of a trial's pod: the trial's and the owner's labels, and the
    caller's (those with valid keys, values made valid; they override neither); the caller's
    originals as an annotation."""
    valid = {str(k): label_value(v) for k, v in labels.items() if valid_label_key(str(k))}
    out = {
        **trial_labels(
            run_id=None, trial_id=label_value(trial_id), task_id=label_value(task_id), extra=valid
        ),
        **owner_labels(),
    }
    annotations = {ANNOTATION_LABELS: json.dumps({str(k): str(v) for k, v in labels.items()})}
    return out, annotations


def deadline_s(task: Any, config: K8sBackendConfig) -> int:
    if config.active_deadline_s:
        return config.active_deadline_s
    agent = getattr(getattr(task, "agent", None), "timeout_s", None) or 600.0
    verifier = getattr(getattr(task, "verifier", None), "timeout_s", None) or 600.0
    return int(agent + verifier + 600)


def _quantity_cpu(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def resources(environment: Any, config: K8sBackendConfig) -> dict[str, dict[str, str]]:
    cpus = float(getattr(environment, "cpus", 1.0) or 1.0)
    memory_mb = int(getattr(environment, "memory_mb", 2048) or 2048)
    storage_mb = getattr(environment, "storage_mb", None)
    ratio = config.request_ratio
    limits = {"cpu": _quantity_cpu(cpus), "memory": f"{memory_mb}Mi"}
    requests = {
        "cpu": _quantity_cpu(cpus * ratio),
        "memory": f"{max(1, int(memory_mb * ratio))}Mi",
    }
    if config.limit_storage and storage_mb:
        limits["ephemeral-storage"] = f"{int(storage_mb)}Mi"
        requests["ephemeral-storage"] = f"{max(1, int(storage_mb * ratio))}Mi"
    return {"limits": limits, "requests": requests}


def pod_manifest(
    *,
    name: str,
    task: Any,
    image: str,
    pull_policy: str,
    config: K8sBackendConfig,
    labels: dict[str, str],
    annotations: dict[str, str],
    mounts: Mapping[Path, str],
    link_dir: str | None = None,
) -> dict[str, Any]:
    """The pod of one trial: the task image idling, limits, deadline, no API token.

    With ``link_dir`` (network = "loopback") the pod keeps only lo, and its main process is
    the relay from 127.0.0.1:link_port to the proxy socket in ``link_dir``.
    """
    env = task.environment
    volumes, volume_mounts, init_containers = _bundle_volumes(mounts, config, pull_policy)
    res = resources(env, config)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": IDLE_COMMAND,
        "stdin": True,
        "env": [{"name": k, "value": str(v)} for k, v in (getattr(env, "env", None) or {}).items()],
        "resources": res,
        "volumeMounts": volume_mounts,
    }
    if link_dir is not None:
        volumes.append({"name": "slr-link", "hostPath": {"path": link_dir, "type": "Directory"}})
        volume_mounts.append({"name": "slr-link", "mountPath": LINK_MOUNT, "readOnly": True})
        container["command"] = [
            "python3",
            RELAY_TAG,
            str(config.link_port),
            f"{LINK_MOUNT}/proxy.sock",
        ]
        container["stdin"] = False
        init_containers.insert(
            0,
            {
                "name": "slr-drop-network",
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": ["python3", "-c", DROP_INTERFACES],
                "resources": res,
                "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
            },
        )
    workdir = getattr(env, "workdir", None)
    if workdir:
        container["workingDir"] = workdir
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": deadline_s(task, config),
        # Agents must get no credentials to the cluster they run in.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": "sandbox",
        "shareProcessNamespace": True,
        "containers": [container],
        "volumes": volumes,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if config.node_selector:
        spec["nodeSelector"] = dict(config.node_selector)
    if config.tolerations:
        spec["tolerations"] = [dict(t) for t in config.tolerations]
    if config.service_account:
        spec["serviceAccountName"] = config.service_account
    if config.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in config.image_pull_secrets]
    if config.runtime_class:
        spec["runtimeClassName"] = config.runtime_class
    if config.priority_class:
        spec["priorityClassName"] = config.priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**config.labels, **labels, LABEL_POD: name},
            "annotations": {**config.annotations, **annotations},
        },
        "spec": spec,
    }


def _bundle_volumes(
    mounts: Mapping[Path, str], config: K8sBackendConfig, pull_policy: str
) -> tuple[list[dict], list[dict], list[dict]]:
    volumes: list[dict] = []
    volume_mounts: list[dict] = []
    init: list[dict] = []
    for i, (host, inner) in enumerate(sorted(mounts.items(), key=lambda kv: kv[1])):
        vol = f"bundle-{i}"
        volume_mounts.append({"name": vol, "mountPath": inner, "readOnly": True})
        if config.bundle_mode == "hostPath":
            volumes.append(
                {"name": vol, "hostPath": {"path": str(Path(host).resolve()), "type": "Directory"}}
            )
            continue
        image = config.bundle_images.get(inner)
        if image is None:
            raise ValueError(
                f"bundle_mode = 'image' but backend.bundle_images has no image for the mount "
                f"{inner!r} (host folder {host}); add bundle_images.{inner!r} = '<image that "
                f"holds the bundle at {inner}>'"
            )
        volumes.append({"name": vol, "emptyDir": {}})
        init.append(
            {
                "name": f"copy-{vol}",
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": ["sh", "-c", 'cp -a "$0/." "$1/"', inner, BUNDLE_SCRATCH],
                "volumeMounts": [{"name": vol, "mountPath": BUNDLE_SCRATCH}],
            }
        )
    return volumes, volume_mounts, init


def network_policy(
    *, name: str, labels: dict[str, str], proxy_ip: str | None, proxy_port: int | None
) -> dict[str, Any]:
    """Deny all ingress and egress of pod ``name``, except egress to the proxy when given."""
    egress: list[dict[str, Any]] = []
    if proxy_ip:
        rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": f"{proxy_ip}/32"}}]}
        if proxy_port:
            rule["ports"] = [{"protocol": "TCP", "port": proxy_port}]
        egress.append(rule)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_POD: name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
