"""Each sandbox backend's own preflight checks, tripped and passed on this machine: the
docker daemon, bubblewrap for the local backend, the k8s credentials and containerd socket
(the cluster itself: sandbox_backends/k8s/tests/test_k8s_preflight.py)."""

from __future__ import annotations

import socket

import pytest

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, run_checks


def check(name: str, backend: str, *sets: str):
    plugins = get_plugin_manager()
    cfg = load_config(plugins=plugins, choose={"agent": "nop", "backend": backend}, sets=list(sets))
    checks = [c for c in plugins.preflight_checks() if c.name == name]
    assert checks, f"no preflight check {name!r} is registered"
    report = run_checks(checks, Context(config=cfg, plugins=plugins))
    return [line.result for line in report.lines]


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_docker_daemon_answers():
    [result] = check("docker-daemon", "docker")
    assert result.status == "pass" and "docker daemon" in result.message


@pytest.mark.timeout(60)
def test_no_docker_daemon_is_fatal_with_its_fix(tmp_path):
    [result] = check("docker-daemon", "docker", f'backend.base_url="unix://{tmp_path}/none.sock"')
    assert result.status == "fatal"
    assert "none.sock" in result.message and "docker info" in result.fix


def test_local_backend_with_bubblewrap_passes():
    [result] = check("local-isolation", "local")
    assert result.status == "pass" and "bubblewrap" in result.message


def test_local_backend_without_bubblewrap_is_fatal(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    [result] = check("local-isolation", "local")
    assert result.status == "fatal" and "apt-get install bubblewrap" in result.fix
    [required] = check("local-isolation", "local", 'backend.isolation="bubblewrap"')
    assert required.status == "fatal" and "not installed" in required.message
    [unsafe] = check("local-isolation", "local", "backend.unsafe_host_paths=true")
    assert unsafe.status == "warn"


def test_k8s_without_a_kubeconfig_is_one_fatal_line(tmp_path):
    [result] = check("k8s-api", "k8s", f'backend.kubeconfig="{tmp_path}/kubeconfig"')
    assert result.status == "fatal"
    assert "no kubeconfig at" in result.message and "KUBECONFIG" in result.message
    assert result.doc == "docs/troubleshooting/sandboxes.md#kubernetes-api-unreachable"


def test_k8s_containerd_socket_missing_is_fatal_and_present_passes(tmp_path):
    [missing] = check("k8s-images", "k8s", f'backend.containerd_address="{tmp_path}/c.sock"')
    assert missing.status == "fatal" and "containerd_address" in missing.fix
    path = tmp_path / "containerd.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        [present] = check(
            "k8s-images", "k8s", f'backend.containerd_address="{path}"', 'backend.ctr="sh"'
        )
    assert present.status == "pass", present
    [no_ctr] = check(
        "k8s-images", "k8s", f'backend.containerd_address="{path}"', 'backend.ctr="no-ctr-here"'
    )
    assert no_ctr.status == "fatal" and "ctr" in no_ctr.fix


def test_k8s_registry_without_a_registry_is_fatal_in_the_config_stage():
    [result] = check("k8s-config", "k8s", 'backend.image_load="registry"')
    assert result.status == "fatal" and "backend.registry" in result.fix
    [fine] = check("k8s-config", "k8s")
    assert fine.status == "pass"


def _task_from(tmp_path, name: str, base: str):
    """A copy of examples/tasks/hello-world whose Dockerfile builds FROM ``base``."""
    import shutil
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples" / "tasks"
    task = tmp_path / "tasks" / name
    shutil.copytree(examples / "hello-world", task)
    (task / "environment" / "Dockerfile").write_text(f"FROM {base} AS build\nFROM build\n")
    return task.parent


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_task_images_buildable_from_local_bases_pass_and_a_missing_base_is_named(
    tmp_path, monkeypatch
):
    from slr_backend_docker import preflight
    from slr_backend_docker.base_image import BASE_TAG

    tasks = _task_from(tmp_path, "from-base", BASE_TAG)
    [ok] = check("docker-images", "docker", f'tasks.path="{tasks}"')
    assert ok.status == "pass", ok
    assert "build from local images" in ok.message
    # the slr base is built here and in no registry: its absence is fatal, with the command
    monkeypatch.setattr(preflight, "BASE_TAG", "slr-base:no-such-suite")
    missing = _task_from(tmp_path / "m", "from-missing", "slr-base:no-such-suite")
    [fatal] = check("docker-images", "docker", f'tasks.path="{missing}"')
    assert fatal.status == "fatal" and "FROM slr-base:no-such-suite" in fatal.message
    assert fatal.fix == "build it once: `slr images base`"
    # any other absent base is pulled at the first build: a warning naming it
    pulled = _task_from(tmp_path / "p", "from-hub", "slr-test-no-such-image:1")
    [warned] = check("docker-images", "docker", f'tasks.path="{pulled}"')
    assert warned.status == "warn" and "slr-test-no-such-image:1" in warned.message


def test_dockerfile_bases_leave_out_stages_scratch_and_build_arguments(tmp_path):
    from slr_backend_docker.preflight import from_images

    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG V=3\nFROM --platform=linux/amd64 python:3.12 AS deps\nFROM scratch\n"
        "FROM deps\nFROM debian:${V}\nfrom slr-base:bookworm\n"
    )
    assert from_images(dockerfile) == ["python:3.12", "slr-base:bookworm"]


@pytest.mark.timeout(60)
def test_local_image_roots_without_any_image_store_are_fatal_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    sets = (f'backend.oci_layout="{tmp_path}/no-layout"',)
    [result] = check("local-images", "local", 'backend.rootfs="image"', *sets)
    assert result.status == "fatal" and "no image store is reachable" in result.message
    assert "skopeo copy" in result.fix and "backend.rootfs = 'host'" in result.fix
    [auto] = check("local-images", "local", 'backend.rootfs="auto"', *sets)
    assert auto.status == "warn" and "host's userland" in auto.message


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_local_image_roots_from_the_docker_store_pass():
    [result] = check("local-images", "local", 'backend.rootfs="image"')
    assert result.status == "pass" and "docker image store" in result.message


class _Nodes:
    """The two calls ``node_pids_limits`` makes, answered from a dict of kubelet configs."""

    def __init__(self, configz: dict[str, object], fail: Exception | None = None):
        self.configz, self.fail = configz, fail
        self.proxied: list[str] = []

    def list_node(self, label_selector, _request_timeout):
        from types import SimpleNamespace

        self.selector = label_selector
        names = list(self.configz)[::-1]  # not in name order: the check sorts them
        return SimpleNamespace(
            items=[SimpleNamespace(metadata=SimpleNamespace(name=n)) for n in names]
        )

    def connect_get_node_proxy_with_path(self, name, path, _preload_content, _request_timeout):
        import json
        from types import SimpleNamespace

        assert path == "configz"
        if self.fail:
            raise self.fail
        self.proxied.append(name)
        return SimpleNamespace(data=json.dumps(self.configz[name]).encode())


def test_k8s_pod_pids_limit_reads_the_kubelet_configuration():
    from slr_backend_k8s.preflight import pod_pids_limit

    assert pod_pids_limit({"kubeletconfig": {"podPidsLimit": 4096}}) == 4096
    assert pod_pids_limit({"podPidsLimit": 100}) == 100  # a bare KubeletConfiguration
    # unset, -1 and 0 all leave a pod's pids.max at "max"
    for unlimited in (
        {"kubeletconfig": {}},
        {"kubeletconfig": {"podPidsLimit": -1}},
        {"kubeletconfig": {"podPidsLimit": 0}},
        {"kubeletconfig": {"podPidsLimit": True}},
        [],
        "garbage",
    ):
        assert pod_pids_limit(unlimited) is None, unlimited


def test_k8s_node_pids_limits_per_node_sorted_and_bounded():
    from types import SimpleNamespace

    from slr_backend_k8s.preflight import NodeUnreadable, node_pids_limits

    nodes = _Nodes({f"n{i}": {"kubeletconfig": {"podPidsLimit": 100 + i}} for i in range(5)})
    nodes.configz["n9"] = {"kubeletconfig": {}}
    count, limits = node_pids_limits(SimpleNamespace(core=nodes), {"pool": "trials"}, most=3)
    assert nodes.selector == "pool=trials"
    assert count == 6 and limits == {"n0": 100, "n1": 101, "n2": 102}  # the first 3 by name
    _, limits = node_pids_limits(SimpleNamespace(core=nodes), {})
    assert limits["n9"] is None and limits["n4"] == 104

    denied = _Nodes({"n0": {}}, fail=RuntimeError("403 forbidden: nodes/proxy"))
    with pytest.raises(NodeUnreadable, match="kubelet configuration of node 'n0'.*403"):
        node_pids_limits(SimpleNamespace(core=denied), {})


@pytest.mark.parametrize(
    ("configz", "status", "words"),
    [
        ({"a": {"kubeletconfig": {"podPidsLimit": 4096}}}, "pass", "limited to 4096 processes"),
        (
            {"a": {"kubeletconfig": {"podPidsLimit": 4096}}, "b": {"kubeletconfig": {}}},
            "warn",
            "1 of 2 nodes run pods with no process limit (kubelet podPidsLimit unset: b)",
        ),
        ({}, "warn", "no node"),
    ],
)
def test_k8s_pids_check_warns_on_a_node_without_a_process_limit(
    monkeypatch, tmp_path, configz, status, words
):
    import slr_backend_k8s.api as api

    class FakeApi:
        def __init__(self, **_):
            self.core = _Nodes(configz)

        def close(self):
            pass

    monkeypatch.setattr(api, "KubeApi", FakeApi)
    [result] = check("k8s-pids", "k8s")
    assert result.status == status and words in result.message, result
    if status == "warn" and configz:
        assert "podPidsLimit: 4096" in result.fix
        assert result.doc == "docs/troubleshooting/sandboxes.md#pods-without-a-process-limit"


def test_k8s_pids_check_warns_when_the_nodes_cannot_be_read(monkeypatch):
    import slr_backend_k8s.api as api

    class Denied:
        def __init__(self, **_):
            self.core = _Nodes({"a": {}}, fail=RuntimeError("403 forbidden"))

        def close(self):
            pass

    monkeypatch.setattr(api, "KubeApi", Denied)
    [result] = check("k8s-pids", "k8s")
    assert result.status == "warn" and "cannot tell" in result.message, result
    assert "nodes/proxy" in result.fix and "podPidsLimit" in result.fix
