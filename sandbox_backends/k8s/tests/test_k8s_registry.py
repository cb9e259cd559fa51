"""image_load = "registry" on the real cluster: the task image is built, pushed to a real
registry (Debian's docker-registry on a loopback port, the `registry` fixture) and pulled by
the node's containerd for the pod, never imported by hand.

The image is a static busybox on scratch (~2 MB), so the push is quick; the pod runs with
network = "policy" (its idle command needs only `sh`). The node is this machine, so the
kubelet reaches the registry on 127.0.0.1, which containerd pulls from over plain http.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import attrs
import pytest
from k8s_support import run
from slr_backend_k8s.backend import K8sBackend

from slr.tasks import load_task

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]


def busybox_task(root: Path, name: str) -> Path:
    busybox = shutil.which("busybox")
    assert busybox, "install Debian's busybox-static (a static busybox for a scratch image)"
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text('version = "1.0"\n')
    (d / "instruction.md").write_text("Nothing to do.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    shutil.copy(busybox, d / "environment" / "busybox")
    (d / "environment" / "marker").write_text(f"{name}\n")
    (d / "environment" / "Dockerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\n"
        'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        "COPY marker /marker\n"
    )
    return d


def test_pods_pull_the_pushed_task_image_from_the_registry(k8s_config, registry, tmp_path):
    import docker

    task = load_task(busybox_task(tmp_path, f"reg-{uuid.uuid4().hex[:8]}"))
    prefix = f"{registry}/slr"
    b = K8sBackend(
        attrs.evolve(k8s_config, image_load="registry", registry=prefix, network="policy")
    )
    client = docker.from_env()
    try:
        sandbox = run(b.start(task, trial_id=f"reg-{uuid.uuid4().hex[:6]}", labels={}))
        try:
            res = run(sandbox.exec(["cat", "/marker"]))
            assert res.stdout.strip() == task.id, res
            pod = b.api.core.read_namespaced_pod(sandbox.name, k8s_config.namespace)
            container = pod.spec.containers[0]
            assert container.image == b.images.pod_image(task)
            assert container.image.startswith(f"{prefix}/")
            assert container.image_pull_policy == "IfNotPresent"
            # the node's containerd got it from the registry (nothing imported it by hand)
            node = [k8s_config.ctr, "-a", k8s_config.containerd_address, "-n", "k8s.io"]
            listed = subprocess.run(
                [*node, "images", "ls", "-q"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert container.image in listed.stdout.split()
        finally:
            run(sandbox.stop())
    finally:
        run(b.close())
        for image in client.images.list(filters={"label": f"slr.task_id={task.id}"}):
            client.images.remove(image.id, force=True)
        client.close()
        # what the node pulled: its containerd's copy of the image
        ctr = [k8s_config.ctr, "-a", k8s_config.containerd_address, "-n", "k8s.io", "images"]
        listed = subprocess.run([*ctr, "ls", "-q"], capture_output=True, text=True, check=False)
        pulled = [r for r in listed.stdout.split() if r.startswith(f"{prefix}/")]
        subprocess.run([*ctr, "rm", *pulled], capture_output=True, check=False)
