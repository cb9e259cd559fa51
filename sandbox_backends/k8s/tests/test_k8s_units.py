"""Parts of the k8s backend that need no cluster: manifests, the exec wrapper, config."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from k8s_support import py_task
from slr_backend_k8s import K8sBackendConfig
from slr_backend_k8s.execstream import KILL_TREE, parse_status, wrap
from slr_backend_k8s.images import normalize_ref
from slr_backend_k8s.podspec import (
    LABEL_POD,
    label_value,
    network_policy,
    pod_labels,
    pod_manifest,
    valid_label_key,
)

from slr.config.structure import structure
from slr.errors import ConfigError
from slr.plugins import PluginManager
from slr.sandboxing.labels import RUN, TRIAL


def manifest(config=None, mounts=None, **labels):
    lab, ann = pod_labels("Fix_Median!", "trial/1", labels)
    return pod_manifest(
        name="slr-x-1",
        task=py_task(cpus=1.5, memory_mb=512, storage_mb=1024, workdir="/app", env={"A": "1"}),
        image="img:1",
        pull_policy="Never",
        config=config or K8sBackendConfig(),
        labels=lab,
        annotations=ann,
        mounts=mounts or {},
    )


def test_pod_carries_limits_deadline_workdir_and_no_token():
    m = manifest(K8sBackendConfig(request_ratio=0.5, runtime_class="gvisor"))
    spec = m["spec"]
    c = spec["containers"][0]
    assert c["resources"]["limits"] == {
        "cpu": "1500m",
        "memory": "512Mi",
        "ephemeral-storage": "1024Mi",
    }
    assert c["resources"]["requests"]["cpu"] == "750m"
    assert c["workingDir"] == "/app"
    assert c["env"] == [{"name": "A", "value": "1"}]
    assert c["imagePullPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 60 + 60 + 600
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["runtimeClassName"] == "gvisor"
    assert m["metadata"]["labels"][LABEL_POD] == "slr-x-1"


def test_labels_are_made_valid_and_the_originals_kept():
    # the caller's labels never replace the trial's own
    m = manifest(**{RUN: "run 2026/11/30", "bad key!": "x", TRIAL: "not/this"})
    labels = m["metadata"]["labels"]
    assert labels[TRIAL] == "trial-1"
    assert labels[RUN] == "run-2026-11-30"
    assert "bad key!" not in labels
    original = json.loads(m["metadata"]["annotations"]["slr.dev/labels"])
    assert original == {RUN: "run 2026/11/30", "bad key!": "x", TRIAL: "not/this"}
    assert label_value("-" * 3 + "a" * 80) == "a" * 60
    assert valid_label_key("example.com/x") and not valid_label_key("Bad_Prefix/x")


def test_bundles_by_host_path_or_init_container(tmp_path):
    m = manifest(mounts={tmp_path: "/opt/agent"})
    assert m["spec"]["volumes"][0]["hostPath"]["path"] == str(tmp_path)
    assert m["spec"]["containers"][0]["volumeMounts"][0] == {
        "name": "bundle-0",
        "mountPath": "/opt/agent",
        "readOnly": True,
    }
    cfg = K8sBackendConfig(bundle_mode="image", bundle_images={"/opt/agent": "agent-rt:1"})
    m = manifest(cfg, mounts={tmp_path: "/opt/agent"})
    assert m["spec"]["volumes"][0] == {"name": "bundle-0", "emptyDir": {}}
    assert m["spec"]["initContainers"][0]["image"] == "agent-rt:1"
    with pytest.raises(ValueError, match="bundle_images has no image for the mount '/opt/agent'"):
        manifest(K8sBackendConfig(bundle_mode="image"), mounts={tmp_path: "/opt/agent"})


def test_network_policy_allows_only_the_proxy():
    p = network_policy(name="p", labels={}, proxy_ip="10.0.0.1", proxy_port=None)
    assert p["spec"]["podSelector"] == {"matchLabels": {LABEL_POD: "p"}}
    assert p["spec"]["ingress"] == []
    assert p["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}]
    closed = network_policy(name="p", labels={}, proxy_ip=None, proxy_port=None)
    assert closed["spec"]["egress"] == []


def test_image_names_are_normalized_like_containerd():
    assert normalize_ref("slr-task-x:abc") == "docker.io/library/slr-task-x:abc"
    assert normalize_ref("busybox") == "docker.io/library/busybox:latest"
    assert normalize_ref("me/img:1") == "docker.io/me/img:1"
    assert normalize_ref("reg.io:5000/a/b:2") == "reg.io:5000/a/b:2"


def test_exit_status_parsing():
    assert parse_status(b'{"metadata":{},"status":"Success"}') == (0, "")
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert parse_status(json.dumps(failure).encode()) == (3, "")
    assert parse_status(b"") == (None, "")
    other = {"status": "Failure", "message": 'exec: "sh": not found'}
    assert parse_status(json.dumps(other).encode()) == (None, 'exec: "sh": not found')


def test_exec_wrapper_sets_rlimits_that_cannot_be_raised_without_privilege():
    script = "ulimit -n; ulimit -f; ulimit -n 99999 2>/dev/null && echo raised || echo kept"
    argv = wrap(["sh", "-c", script], marker="m", open_files=100, file_size_mb=2)
    if os.geteuid() == 0:  # root here has CAP_SYS_RESOURCE, a pod's root does not
        argv = ["setpriv", "--inh-caps=-all", "--bounding-set=-sys_resource", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["100", str(2 * 2048), "kept"]  # one file: 2 MB in 512-byte blocks


def test_exec_wrapper_sets_cwd_env_and_marker(tmp_path):
    # The wrapper is plain POSIX sh: run it here, as the pod would.
    argv = wrap(
        ["sh", "-c", 'pwd; echo "$X|$Y"; echo "$SLR_EXEC_ID"'],
        marker="m1",
        cwd=str(tmp_path),
        env={"X": "a b", "Y": "$HOME"},
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == [str(tmp_path), "a b|$HOME", "m1"]
    bad = subprocess.run(wrap(["true"], marker="m", cwd="/nonexistent"), capture_output=True)
    assert bad.returncode == 126
    with pytest.raises(ValueError):
        wrap(["true"], marker="m", env={"A-B": "1"})


def test_kill_tree_kills_only_marked_processes():
    marked = subprocess.Popen(wrap(["sh", "-c", "sleep 30 & wait"], marker="kill-me"))
    other = subprocess.Popen(wrap(["sleep", "30"], marker="keep-me"))
    try:
        subprocess.run(["sh", "-c", KILL_TREE, "slr-kill", "kill-me"], check=True, timeout=20)
        assert marked.wait(timeout=10) != 0
        assert other.poll() is None
    finally:
        other.kill()
        marked.kill()


def test_registered_with_its_config_and_errors_by_name():
    reg = PluginManager().get("sandbox_backend", "k8s")
    assert reg.plugin.distribution == "slr-backend-k8s"
    assert reg.config_cls is K8sBackendConfig
    assert reg.load().__name__ == "K8sBackend"
    cfg = structure({"namespace": "rl", "tolerations": [{"key": "gpu"}]}, K8sBackendConfig)
    assert cfg.namespace == "rl"
    assert cfg.tolerations == [{"key": "gpu"}]
    with pytest.raises(ConfigError, match="image_load"):
        structure({"image_load": "push"}, K8sBackendConfig, path="backend")
    with pytest.raises(ConfigError, match="Did you mean 'namespace'"):
        structure({"namespaces": "x"}, K8sBackendConfig, path="backend")


def test_readme_documents_every_option():
    readme = (
        Path(__file__).resolve().parents[3] / "sandbox_backends" / "k8s" / "README.md"
    ).read_text()
    import attrs

    for f in attrs.fields(K8sBackendConfig):
        assert f"`{f.name}`" in readme, f"README.md does not document backend option {f.name}"
