"""Fixtures shared by the sandbox backend tests (``tests/sandbox_backends`` and each
backend's own ``tests/``, whose conftest.py imports them): the verifier, the example
tasks, a private image registry."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from slr.tasks import load_tasks

__all__ = ["example_tasks", "free_port", "registry", "verifier"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"


@pytest.fixture(scope="session")
def verifier():
    """The conformance suite's verifier: the example tasks are Harbor tasks."""
    from slr_verifier_harbor.verifier import HarborVerifier

    return HarborVerifier()


@pytest.fixture(scope="session")
def example_tasks():
    tasks = load_tasks(EXAMPLES)
    # The simple task first: the conformance suite starts its plain sandboxes from it.
    return sorted(tasks, key=lambda t: t.id != "hello-world")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def registry(tmp_path):
    """Debian's docker-registry on a free loopback port with its own storage; stopped after."""
    exe = shutil.which("docker-registry")
    assert exe, "install Debian's docker-registry package (scripts/test does)"
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: info\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        [exe, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ready once it says it listens
            if "listening on" in line:
                break
        else:
            pytest.fail(f"docker-registry exited ({proc.wait()}) before listening")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
