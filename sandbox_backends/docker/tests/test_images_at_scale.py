"""`slr images build / prune` and registry push on the real daemon and a real registry.

Tiny task images FROM the base image, under a prefix of this test's own (so nothing another
process built is ever pruned), removed at the end by their labels. The registry is Debian's
`docker-registry` (the distribution registry), started here on a free loopback port with its
own storage folder (the `registry` fixture, tests/backend_fixtures.py); the daemon
trusts 127.0.0.0/8 registries over plain http by default.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import docker.errors
import pytest
from click.testing import CliRunner
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker import prune as pruning
from slr_backend_docker.backend import DockerBackend
from slr_backend_docker.base_image import BASE_TAG
from slr_backend_docker.builds import build_images
from slr_backend_docker.client import connect
from slr_backend_docker.commands import images
from slr_backend_docker.tags import LABEL_IMAGE, TASK_IMAGE

from slr.sandboxing.labels import TASK
from slr.tasks import load_task, load_tasks

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


def make_task(root: Path, name: str, run: str = "true", dockerfile: str = "") -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n')
    (d / "instruction.md").write_text("Nothing to do.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile or f"FROM {BASE_TAG}\nRUN {run}\n")
    (d / "environment" / "marker").write_text(name)
    return d


@pytest.fixture
def client():
    c = connect()
    assert c.images.get(BASE_TAG), f"run `slr images base` first ({BASE_TAG})"
    return c


@pytest.fixture
def ns(client):
    """A prefix for this test's task ids and image names; its images are removed after."""
    tag = f"imgt{uuid.uuid4().hex[:8]}"
    yield tag
    for c in client.containers.list(all=True, filters={"label": f"slr.test={tag}"}):
        c.remove(force=True)
    ours = [
        i
        for i in client.images.list(filters={"label": f"{LABEL_IMAGE}={TASK_IMAGE}"})
        if (i.labels or {}).get(TASK, "").startswith(tag)
    ]
    # an image built FROM another must go before its parent: retry what the daemon refused
    for _ in range(len(ours)):
        refused = []
        for image in ours:
            try:
                client.images.remove(image.id, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError:
                refused.append(image)
        ours = refused


def invoke(*args: str, code: int = 0) -> dict:
    res = CliRunner().invoke(images, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == code, res.output
    return json.loads(res.stdout[res.stdout.index("{") :])


def test_build_each_image_once_in_parallel_with_logs_for_failures(client, ns, tmp_path):
    tasks = tmp_path / "set"
    for i in range(3):
        make_task(tasks, f"{ns}-ok{i}", run=f"echo {i} > /built")
    make_task(tasks, f"{ns}-broken", run="echo 'no such tool' >&2 && false")
    logs = tmp_path / "logs"
    cold = invoke("build", str(tasks), "-j", "4", "--prefix", ns, "--logs", str(logs), code=1)
    by = {i["task_id"]: i for i in cold["images"]}
    assert (cold["built"], cold["cached"], cold["failed"]) == (3, 0, 1), cold
    assert cold["logs"] == str(logs)
    failure = by[f"{ns}-broken"]
    assert failure["status"] == "failed" and Path(failure["log"]).parent == logs
    assert "no such tool" in Path(failure["log"]).read_text()
    image = client.images.get(by[f"{ns}-ok0"]["tag"])
    assert image.labels[LABEL_IMAGE] == TASK_IMAGE and image.labels[TASK] == f"{ns}-ok0"

    warm = invoke("build", str(tasks), "-j", "4", "--prefix", ns, "--logs", str(logs), code=1)
    assert (warm["built"], warm["cached"], warm["failed"]) == (0, 3, 1), warm

    # a run config names the same tasks and image prefix: the same tags
    config = tmp_path / "run.toml"
    config.write_text(
        f'[tasks]\npath = "{tasks}"\n[backend]\nname = "docker"\nimage_prefix = "{ns}"\n'
    )
    from_config = invoke("build", "-c", str(config), "--logs", str(logs), code=1)
    assert [i["tag"] for i in from_config["images"]] == [i["tag"] for i in warm["images"]]
    assert (from_config["cached"], from_config["failed"]) == (3, 1)

    # a trial's backend finds the same tags: nothing is built again
    async def trial_side():
        backend = DockerBackend(DockerBackendConfig(image_prefix=ns))
        backend._build = _must_not_build
        try:
            return [await backend.ensure_image(load_task(tasks / f"{ns}-ok{i}")) for i in range(3)]
        finally:
            await backend.close()

    assert asyncio.run(trial_side()) == ["cached"] * 3


def _must_not_build(task, tag):
    raise AssertionError(f"{tag} was built again")


def test_jobs_bounds_how_many_builds_run_at_once(client, ns, tmp_path):
    for i in range(3):
        make_task(tmp_path, f"{ns}-j{i}", run=f"echo {i} > /j")
    tasks = load_tasks(tmp_path)
    events: list[str] = []

    async def run(jobs: int):
        backend = DockerBackend(DockerBackendConfig(image_prefix=ns))
        try:
            return await build_images(
                backend,
                tasks,
                jobs=jobs,
                log_dir=tmp_path / "logs",
                on_start=lambda t: events.append("start"),
                on_done=lambda r: events.append("done"),
            )
        finally:
            await backend.close()

    asyncio.run(run(1))  # cold: one at a time
    assert events == ["start", "done"] * 3
    events.clear()
    warm = asyncio.run(run(3))  # all three admitted before the first finishes
    assert events[:3] == ["start"] * 3 and [r.status for r in warm] == ["cached"] * 3


def test_push_to_a_registry_and_another_machine_pulls_instead_of_building(
    client, ns, tmp_path, registry
):
    # FROM scratch: a fresh registry would otherwise receive the whole base image's layers
    make_task(tmp_path / "set", f"{ns}-reg", dockerfile="FROM scratch\nCOPY marker /marker\n")
    prefix = f"{registry}/slr"
    out = invoke("build", str(tmp_path / "set"), "--prefix", ns, "--push", prefix)
    (image,) = out["images"]
    assert image["status"] == "built" and image["pushed"] == f"{prefix}/{image['tag']}"
    repo, _, version = image["tag"].rpartition(":")
    with urllib.request.urlopen(f"http://{registry}/v2/slr/{repo}/tags/list", timeout=10) as r:
        assert version in json.load(r)["tags"]

    # a machine without the image: the backend pulls it from the registry, builds nothing
    client.images.remove(image["pushed"])
    client.images.remove(image["tag"])

    async def other_machine():
        backend = DockerBackend(DockerBackendConfig(image_prefix=ns, registry=prefix))
        backend._build = _must_not_build
        try:
            return await backend.ensure_image(load_task(tmp_path / "set" / f"{ns}-reg"))
        finally:
            await backend.close()

    assert asyncio.run(other_machine()) == "pulled"
    assert client.images.get(image["tag"]).labels[TASK] == f"{ns}-reg"


def test_k8s_pods_run_the_pushed_reference(ns, tmp_path):
    """What the k8s backend's pods pull is what `--push` wrote (no cluster needed to name it)."""
    from slr_backend_k8s.config import K8sBackendConfig
    from slr_backend_k8s.images import ImageLoader

    task = load_task(make_task(tmp_path, f"{ns}-k8s"))
    loader = ImageLoader(K8sBackendConfig(image_load="registry", registry="127.0.0.1:5000/slr/"))
    tag = DockerBackend(DockerBackendConfig()).image_tag(task)
    assert loader.pod_image(task) == f"127.0.0.1:5000/slr/{tag}"
    assert loader.pull_policy == "IfNotPresent"


def test_prune_removes_only_unused_slr_task_images(client, ns, tmp_path):
    keep_set, drop_set = tmp_path / "keep", tmp_path / "drop"
    make_task(keep_set, f"{ns}-keep", run="echo keep > /k")
    make_task(drop_set, f"{ns}-drop", run="echo drop > /d")
    make_task(drop_set, f"{ns}-used", run="echo used > /u")
    built = invoke("build", str(keep_set), str(drop_set), "--prefix", ns)
    tags = {i["task_id"]: i["tag"] for i in built["images"]}
    # an image of the user's own built FROM a task image no set keeps (so it inherits all
    # its labels: slr.image, the task id and content hash), and a container that still uses
    # one of the task images
    client.images.build(
        fileobj=_dockerfile(f"FROM {tags[f'{ns}-drop']}\nLABEL mine=1\n"),
        tag=f"{ns}-mine:1",
        rm=True,
    )
    assert client.images.get(f"{ns}-mine:1").labels[LABEL_IMAGE] == TASK_IMAGE
    client.containers.create(tags[f"{ns}-used"], command=["true"], labels={"slr.test": ns})

    dry = invoke("prune", str(keep_set), "--prefix", ns, "--dry-run")
    listed = {t: i["outcome"] for i in dry["images"] for t in i["tags"]}
    assert listed == {tags[f"{ns}-drop"]: "would remove", tags[f"{ns}-used"]: "would remove"}
    assert dry["kept"] == 1 and client.images.get(tags[f"{ns}-drop"])  # nothing removed

    out = invoke("prune", str(keep_set), "--prefix", ns)
    outcome = {t: i["outcome"] for i in out["images"] for t in i["tags"]}
    assert outcome.keys() == {tags[f"{ns}-drop"], tags[f"{ns}-used"]}
    assert outcome[tags[f"{ns}-drop"]] == "removed"
    assert outcome[tags[f"{ns}-used"]].startswith("kept: in use")
    assert out["removed"] == 1
    names = {t for i in client.images.list() for t in i.tags}
    assert tags[f"{ns}-keep"] in names and tags[f"{ns}-used"] in names
    assert tags[f"{ns}-drop"] not in names
    assert f"{ns}-mine:1" in names and BASE_TAG in names

    # by age: the kept image is younger than a day now, and older than one in two days
    keep_image = client.images.get(tags[f"{ns}-keep"])
    later = pruning.created_at(keep_image) + timedelta(days=2)
    young, _ = pruning.plan(client, keep=None, older_than_days=1.0, prefix=ns)
    old, _ = pruning.plan(client, keep=None, older_than_days=1.0, prefix=ns, now=later)
    assert f"{ns}-keep" not in {i.task_id for i in young}
    assert f"{ns}-keep" in {i.task_id for i in old}


def _dockerfile(text: str):
    import io

    return io.BytesIO(text.encode())


def test_prune_needs_task_sets_or_an_age():
    res = CliRunner().invoke(images, ["prune"])
    assert res.exit_code == 2 and "--older-than" in res.output


def test_a_url_is_not_a_registry_prefix(tmp_path):
    with pytest.raises(ValueError, match="without http://"):
        DockerBackendConfig(registry="http://127.0.0.1:5000/slr")
    res = CliRunner().invoke(images, ["build", str(tmp_path), "--push", "https://reg:5000"])
    import slr_cli.main  # noqa: F401  (as in the whole suite: rich-click boxes and wraps errors)

    said = " ".join(re.sub(r"[\u2500-\u257f]", " ", res.output).split())
    assert res.exit_code == 2 and "not a registry prefix" in said, res.output
