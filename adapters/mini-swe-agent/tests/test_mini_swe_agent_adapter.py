"""mini-swe-agent, the real package, through the adapter conformance suite."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from slr_adapter_mini_swe_agent.adapter import MiniSweAgent, MiniSweAgentConfig

from slr.contracts import Endpoint
from slr_testkit import ScaffoldAdapterTests
from slr_testkit.scripted_policy import Reply

HELLO = "THOUGHT: write the file.\n\n```mswea_bash_command\nprintf 'hello\\n' > hello.txt\n```"
SUBMIT = "THOUGHT: done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
ENDPOINT = Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m")


class TestMiniSweAgent(ScaffoldAdapterTests):
    @pytest.fixture(scope="class")
    @classmethod
    def adapter(cls):
        return MiniSweAgent()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_script(cls):
        return [Reply(text=HELLO), Reply(text=SUBMIT)]


def test_command_points_its_own_model_class_at_the_endpoint():
    adapter = MiniSweAgent(MiniSweAgentConfig(step_limit=7))
    command, env = adapter.command("/b", ENDPOINT)
    assert command.startswith(
        "/b/python/bin/python3.12 -m minisweagent.run.mini -c mini_textbased.yaml"
    )
    for part in ("model.model_class=slr_mini_model.DirectTextbasedModel",
                 "model.api_base=http://127.0.0.1:9/v1", "model.api_key=k",
                 "agent.step_limit=7", "--model m ", "--yolo", "--exit-immediately"):  # fmt: skip
        assert part in command
    assert "litellm" not in command and "openai/m" not in command
    assert env["LD_LIBRARY_PATH"] == "/b/python/lib" and env["MSWEA_CONFIGURED"] == "true"
    assert env["PYTHONPATH"] == "/tmp/slr-agent/mini"
    assert "class DirectTextbasedModel" in adapter._files()["mini/slr_mini_model.py"]
    tools = MiniSweAgent(MiniSweAgentConfig(action_format="tool_calls")).command("/b", ENDPOINT)[0]
    assert "model.model_class=slr_mini_model.DirectModel" in tools


def test_client_litellm_keeps_minis_litellm_classes():
    adapter = MiniSweAgent(MiniSweAgentConfig(client="litellm"))
    command, env = adapter.command("/b", ENDPOINT)
    for part in ("model.model_class=litellm_textbased", "model.model_kwargs.api_base=http://127.0.0.1:9/v1",
                 "model.model_kwargs.api_key=k", "--model openai/m"):  # fmt: skip
        assert part in command
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert "mini/slr_mini_model.py" not in adapter._files()


@pytest.fixture(scope="module")
def bundle_python() -> tuple[Path, dict[str, str]]:
    from slr.agents.bundle_recipes import python_bin, python_env

    root = MiniSweAgent().bundle().path
    return Path(python_bin(str(root))), python_env(root)


@pytest.mark.timeout(120)
def test_the_model_class_loads_through_minis_setting_without_litellm(bundle_python, tmp_path):
    """mini's own ``get_model`` loads the shipped class by its import path, pointed at the
    endpoint; nothing imports litellm (the start-up cost it exists to avoid)."""
    python, env = bundle_python
    spec = importlib.util.find_spec("slr_adapter_mini_swe_agent")
    assert spec is not None and spec.origin is not None
    module = Path(spec.origin).with_name("direct_model.py").read_text()
    (tmp_path / "slr_mini_model.py").write_text(module)
    probe = (
        "import json, sys\n"
        "import minisweagent.run.mini\n"
        "from minisweagent.models import get_model\n"
        "m = get_model('m', {'model_class': sys.argv[1], 'api_base': 'http://h:1/v1/',\n"
        "    'api_key': 'k', 'timeout_s': 5})\n"
        "print(json.dumps([m._api_url, m._api_key, m._timeout_s,\n"
        "    sorted(n for n in sys.modules if n.split('.')[0] == 'litellm')]))\n"
    )
    for cls in ("slr_mini_model.DirectTextbasedModel", "slr_mini_model.DirectModel"):
        out = subprocess.run(
            [str(python), "-c", probe, cls],
            env={
                **os.environ,
                **env,
                "PYTHONPATH": str(tmp_path),
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
            },
            capture_output=True,
            text=True,
            timeout=110,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, out.stderr
        url, key, timeout, litellm = json.loads(out.stdout.strip().splitlines()[-1])
        assert (url, key, timeout) == ("http://h:1/v1/chat/completions", "k", 5)
        assert litellm == []


def test_the_bundle_ships_unchecked_bytecode_for_the_standard_library(bundle_python):
    python, _ = bundle_python
    lib = python.parents[1] / "lib" / "python3.12"
    for name in ("os", "re/__init__", "json/decoder", "site-packages/requests/__init__"):
        src = lib / f"{name}.py"
        pyc = src.parent / "__pycache__" / f"{src.stem}.cpython-312.pyc"
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == 0b01, f"{pyc}: flags {flags:#b}, want hash-based and unchecked"


class _Refusing(BaseHTTPRequestHandler):
    """Answers every request 400, as the proxy answers a context overflow."""

    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"error": {"message": "context overflow", "type": "invalid_request_error"}}'
        self.send_response(400)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.timeout(120)
def test_a_refused_request_ends_the_run_instead_of_being_retried(bundle_python, tmp_path):
    """mini retries what its model class does not list as an abort: a 400 (a context
    overflow) must end the run, as with mini's litellm classes, not be asked again."""
    python, env = bundle_python
    spec = importlib.util.find_spec("slr_adapter_mini_swe_agent")
    assert spec is not None and spec.origin is not None
    module = Path(spec.origin).with_name("direct_model.py").read_text()
    (tmp_path / "slr_mini_model.py").write_text(module)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = (
        "import sys\n"
        "from minisweagent.models import get_model\n"
        "m = get_model('m', {'model_class': 'slr_mini_model.DirectTextbasedModel',\n"
        "    'api_base': sys.argv[1], 'api_key': 'k'})\n"
        "try:\n"
        "    m.query([{'role': 'user', 'content': 'hi'}])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", probe, f"http://127.0.0.1:{server.server_address[1]}/v1"],
            env={
                **os.environ,
                **env,
                "PYTHONPATH": str(tmp_path),
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                # a retried request would show as a second call (after mini's 4 s back-off)
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
            },
            capture_output=True,
            text=True,
            timeout=110,
            stdin=subprocess.DEVNULL,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "EndpointRefused"
    assert _Refusing.calls == 1
