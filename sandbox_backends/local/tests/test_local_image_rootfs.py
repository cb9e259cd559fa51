"""The local backend running a task in its FROM image's own root (``rootfs = "image"``).

The task is a Harbor task as one finds them: its Dockerfile starts from a Python image and
``pip install``s its test tool. Replayed on the host's userland it cannot build (Debian's
Python refuses with ``externally-managed-environment``); in the image's own root it scores
oracle 1 / nop 0. The image is a stand-in for ``python:3.12-slim`` (no registry here): the
local base image plus pip, with no ``EXTERNALLY-MANAGED`` marker, built once with docker.
The test tool is a small wheel the test writes itself, installed offline from the context.
"""

from __future__ import annotations

import asyncio
import base64
import ensurepip
import hashlib
import io
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend
from slr_backend_local.rootfs import ImageStores, oci_tag
from slr_verifier_harbor.verifier import HarborVerifier

from slr.agents.model_free import NopAgent, OracleAgent
from slr.contracts import SandboxError
from slr.rollout.trial import StandInSessions, run_trial
from slr.tasks import load_task

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300)]

BASE_TAG = "slr-base:bookworm"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _pip_wheel() -> Path:
    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    assert bundled, "this python's ensurepip has no bundled pip wheel"
    return bundled[-1]


@pytest.fixture(scope="module")
def python_image():
    """A python image whose pip installs system-wide, as python:3.12-slim's does."""
    import docker

    client = docker.from_env()
    assert client.images.get(BASE_TAG), f"run `slr images base` first ({BASE_TAG})"
    wheel = _pip_wheel()
    dockerfile = (
        f"FROM {BASE_TAG}\n"
        f"COPY {wheel.name} /tmp/\n"
        f"RUN python3 /tmp/{wheel.name}/pip install --no-index --break-system-packages"
        f" /tmp/{wheel.name} && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED /tmp/{wheel.name}\n"
    )
    digest = hashlib.sha256(dockerfile.encode() + wheel.name.encode()).hexdigest()[:12]
    tag = f"slr-test-python-pip:{digest}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        buf = io.BytesIO()
        import tarfile

        with tarfile.open(fileobj=buf, mode="w") as tf:
            data = dockerfile.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
            tf.add(wheel, arcname=wheel.name)
        buf.seek(0)
        client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True)
    return tag


def _wheel(dest: Path) -> Path:
    """A tiny test tool as a real wheel: ``slrcheck FILE WANT`` exits 0 when FILE holds WANT."""
    files = {
        "slrcheck.py": (
            "import sys\n\ndef main():\n"
            "    got = open(sys.argv[1]).read().strip()\n"
            "    sys.exit(0 if got == sys.argv[2] else 1)\n"
        ),
        "slrcheck-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: slrcheck\nVersion: 1.0\n",
        "slrcheck-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        "slrcheck-1.0.dist-info/entry_points.txt": (
            "[console_scripts]\nslrcheck = slrcheck:main\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append("slrcheck-1.0.dist-info/RECORD,,")
    files["slrcheck-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = dest / "slrcheck-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _pip_task(root: Path, image: str) -> Path:
    task = root / "pip-tools"
    env = task / "environment"
    (env / "wheels").mkdir(parents=True)
    _wheel(env / "wheels")
    (env / "Dockerfile").write_text(
        f"FROM {image}\n"
        "ARG WHEELS=/opt/wheels\n"
        "COPY wheels/ ${WHEELS}/\n"
        "RUN pip install --no-index --find-links ${WHEELS} slrcheck \\\n"
        "    && mkdir -p /opt/task/bin\n"
        "ENV PATH=/opt/task/bin:$PATH\n"
        "WORKDIR /app\n"
    )
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 60.0\n'
        "[environment]\nallow_internet = false\n"
    )
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if slrcheck /app/answer.txt 42; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    for script in (task / "tests" / "test.sh", task / "solution" / "solve.sh"):
        script.chmod(0o755)
    return task


def _backend(root: Path, **kw) -> LocalBackend:
    return LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(root / "ws"),
            cache_dir=str(root / "cache"),
            **kw,
        )
    )


def _trial(task, backend, agent):
    return asyncio.run(
        run_trial(
            task,
            backend=backend,
            agent=agent,
            verifier=HarborVerifier(),
            session_factory=StandInSessions(),
        )
    )


def test_pip_task_fails_on_the_host_userland(tmp_path, python_image):
    task = load_task(_pip_task(tmp_path, python_image))
    with pytest.raises(SandboxError, match="externally-managed-environment"):
        asyncio.run(_backend(tmp_path, rootfs="host").prepare(task))


def test_pip_task_scores_oracle_1_nop_0_in_its_image_root(tmp_path, python_image):
    task = load_task(_pip_task(tmp_path, python_image))
    backend = _backend(tmp_path, rootfs="image")
    oracle = _trial(task, backend, OracleAgent())
    nop = _trial(task, backend, NopAgent())
    assert (oracle.reward.value, nop.reward.value) == (1.0, 0.0), (oracle.logs, nop.logs)

    async def inside():
        sb = await backend.start(task, trial_id="inside", labels={})
        try:
            return await sb.exec('echo "$PATH"; pwd; python3 -c "import slrcheck, sys; print(1)"')
        finally:
            await sb.stop()

    res = asyncio.run(inside())
    # ENV PATH=/opt/task/bin:$PATH reaches the sandbox expanded, from the image's own PATH
    assert res.stdout.splitlines() == [f"/opt/task/bin:{IMAGE_PATH}", "/app", "1"], res
    assert list((tmp_path / "ws").iterdir()) == []


def test_each_trial_gets_a_fresh_root_and_the_image_is_untouched(tmp_path):
    task = load_task(Path(__file__).resolve().parents[3] / "examples" / "tasks" / "hello-world")
    backend = _backend(tmp_path, rootfs="image", root_copy="overlay")

    async def go():
        first = await backend.start(task, trial_id="first", labels={})
        try:
            wrote = await first.exec(
                "echo evil > /usr/bin/evil && rm /etc/os-release && cat /etc/debian_version"
            )
        finally:
            await first.stop()
        second = await backend.start(task, trial_id="second", labels={})
        try:
            seen = await second.exec("ls /usr/bin/evil; head -1 /etc/os-release; pwd")
        finally:
            await second.stop()
        return wrote, seen

    wrote, seen = asyncio.run(go())
    assert wrote.exit_code == 0 and wrote.stdout.strip().startswith("12"), wrote
    assert "No such file" in seen.stderr and 'PRETTY_NAME="Debian GNU/Linux 12' in seen.stdout
    assert seen.stdout.strip().endswith("/app")
    base = backend.stores.base_root(BASE_TAG).fs
    assert not (base / "usr/bin/evil").exists() and (base / "etc/os-release").exists()
    assert list((tmp_path / "ws").iterdir()) == []
    assert str(tmp_path) not in Path("/proc/mounts").read_text(), "an overlay is still mounted"


def test_the_built_root_is_cached_by_content_hash(tmp_path):
    src = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "hello-world"
    shutil.copytree(src, tmp_path / "t")
    (tmp_path / "t" / "environment" / "Dockerfile").write_text(
        "FROM slr-base:bookworm\nRUN date +%s%N > /built-at\nWORKDIR /app\n"
    )
    task = load_task(tmp_path / "t")
    first = asyncio.run(_backend(tmp_path, rootfs="image").prepared(task))
    again = asyncio.run(_backend(tmp_path, rootfs="image").prepared(task))
    assert again.folder == first.folder
    stamp = (first.lowers[0] / "built-at").read_text()
    assert (again.lowers[0] / "built-at").read_text() == stamp
    (tmp_path / "t" / "environment" / "extra.txt").write_text("changed\n")
    changed = asyncio.run(_backend(tmp_path, rootfs="image").prepared(load_task(tmp_path / "t")))
    assert changed.folder != first.folder


TINY_TOOLS = ("bash", "sh", "mkdir", "cp", "cat", "dirname", "rm")


def _tiny_rootfs(dest: Path) -> None:
    """A root of a few megabytes: this machine's shell and coreutils with their libraries."""
    for tool in TINY_TOOLS:
        binary = Path(shutil.which(tool) or f"/bin/{tool}").resolve()
        libs = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for path in [binary, *(Path(w) for w in libs.split() if w.startswith("/"))]:
            real = path.resolve()
            for p in {path, real}:
                out = dest / str(p).lstrip("/")
                out.parent.mkdir(parents=True, exist_ok=True)
                if not out.exists():
                    shutil.copy2(real, out)
        (dest / "bin" / tool).parent.mkdir(parents=True, exist_ok=True)
        if not (dest / "bin" / tool).exists():
            shutil.copy2(binary, dest / "bin" / tool)
    (dest / "etc").mkdir(exist_ok=True)
    (dest / "etc" / "tiny-release").write_text("tiny 1\n")


def _oci_image(layout: Path, tag: str, work: Path) -> None:
    """An OCI image made without any daemon: umoci's new empty image, the tiny root, an ENV."""

    def umoci(*args):
        subprocess.run(["umoci", *args], check=True, capture_output=True)

    umoci("init", "--layout", str(layout))
    umoci("new", "--image", f"{layout}:{tag}")
    umoci("unpack", "--image", f"{layout}:{tag}", str(work / "bundle"))
    _tiny_rootfs(work / "bundle" / "rootfs")
    umoci("repack", "--image", f"{layout}:{tag}", str(work / "bundle"))
    umoci(
        "config",
        "--image",
        f"{layout}:{tag}",
        "--config.env",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "--config.env",
        "FROM_IMAGE=tiny",
    )


def test_an_oci_image_runs_without_a_daemon_copied_per_trial(tmp_path):
    """No daemon asked: the image comes from an OCI layout (umoci unpacks it), each trial
    gets a copy (no overlay), and the relay runs on the host's python (the image has none)."""
    for tool in ("umoci",):
        assert shutil.which(tool), f"apt-get install {tool}"
    layout, ref = tmp_path / "oci", "tiny:1"
    _oci_image(layout, oci_tag(ref), tmp_path)
    task_dir = tmp_path / "t"
    shutil.copytree(
        Path(__file__).resolve().parents[3] / "examples" / "tasks" / "hello-world", task_dir
    )
    (task_dir / "environment" / "hello.txt").write_text("copied\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        f"FROM {ref}\nENV PATH=/opt/tool/bin:$PATH\nWORKDIR /app\nCOPY hello.txt ./\n"
    )
    task = load_task(task_dir)
    backend = _backend(tmp_path, rootfs="image", root_copy="copy")
    backend.stores = ImageStores(tmp_path / "images", layout, docker=False)

    async def go():
        first = await backend.start(task, trial_id="first", labels={})
        try:
            one = await first.exec(
                'cat hello.txt /etc/tiny-release; echo "$PATH $FROM_IMAGE"; rm /etc/tiny-release'
            )
        finally:
            await first.stop()
        second = await backend.start(task, trial_id="second", labels={})
        try:
            two = await second.exec("cat /etc/tiny-release")
        finally:
            await second.stop()
        return one, two

    one, two = asyncio.run(go())
    assert one.stdout.splitlines() == [
        "copied",
        "tiny 1",
        "/opt/tool/bin:/usr/local/bin:/usr/bin:/bin tiny",
    ], one
    assert two.stdout == "tiny 1\n", two
    config = json.loads(next((tmp_path / "images").glob("*/config.json")).read_text())
    assert config["ref"] == ref and config["digest"].startswith("sha256:")
    assert list((tmp_path / "cache").glob("*/layer")) == []  # copied, not layered


def test_a_missing_image_says_where_it_looked_and_what_to_do(tmp_path):
    src = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "hello-world"
    shutil.copytree(src, tmp_path / "t")
    (tmp_path / "t" / "environment" / "Dockerfile").write_text("FROM slr-no-such-image:1\n")
    task = load_task(tmp_path / "t")
    with pytest.raises(SandboxError, match=r"image slr-no-such-image:1 is in no local image store"):
        asyncio.run(_backend(tmp_path, rootfs="image").prepare(task))
    # auto: no image, so the host's userland, as before
    prepared = asyncio.run(_backend(tmp_path, rootfs="auto").prepared(task))
    assert prepared.rootfs == "host"
