"""The k8s sandbox beyond the shared contract, on real pods: exec details, files, proxy link."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time

import pytest
from k8s_support import NAMESPACE, run
from slr_backend_k8s.api import PodGone
from slr_backend_k8s.podspec import LABEL_POD

from slr.contracts import SandboxError
from slr.sandboxing.labels import RUN, TRIAL

pytestmark = pytest.mark.k8s


def test_exec_runs_in_cwd_with_env_and_user(sandbox):
    res = run(
        sandbox.exec(
            ["sh", "-c", 'pwd; echo "$FOO"; id -un'], cwd="/tmp", env={"FOO": "a b"}, user="nobody"
        )
    )
    assert res.ok, res
    assert res.stdout.splitlines() == ["/tmp", "a b", "nobody"]


def test_string_commands_go_through_bash_and_keep_binary_safe_output(sandbox):
    res = run(sandbox.exec("echo ${BASH_VERSION:+bash}; printf 'caf\\xc3\\xa9\\n'"))
    assert res.stdout == "bash\ncafé\n"


def test_large_output_arrives_whole(sandbox):
    res = run(sandbox.exec("head -c 3000000 /dev/zero | tr '\\0' x"))
    assert len(res.stdout) == 3_000_000


PS = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f"; echo; done | grep -c "^{}" || true'


def _count(sandbox, pattern: str) -> int:
    return int(run(sandbox.exec(PS.format(pattern))).stdout.strip() or 0)


async def _until_running(sandbox, pattern: str, n: int) -> None:
    """Poll (bounded) until ``n`` processes match: the command under test has started."""
    for _ in range(200):
        res = await sandbox.exec(PS.format(pattern))
        if res.stdout.strip() == str(n):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{pattern!r} never started")


def test_cancelled_exec_kills_its_process_tree(sandbox):
    async def cancel_a_running_command():
        task = asyncio.ensure_future(sandbox.exec("sleep 301 & sleep 302; wait"))
        await _until_running(sandbox, "sleep 30[12]", 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel_a_running_command())
    deadline = time.monotonic() + 30
    while _count(sandbox, "sleep 30[12]") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _count(sandbox, "sleep 30[12]") == 0


def test_end_processes_spares_only_the_pod_itself(sandbox):
    run(sandbox.exec("nohup sleep 303 >/dev/null 2>&1 &"))
    assert _count(sandbox, "sleep 303") == 1
    run(sandbox.end_processes())
    assert _count(sandbox, "sleep 303") == 0
    assert run(sandbox.exec("echo alive")).stdout == "alive\n"


def test_upload_a_folder_and_download_a_folder(sandbox, tmp_path):
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.bin").write_bytes(bytes(range(256)) * 4000)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    run(sandbox.upload(src, "/srv/deep/tree"))
    assert run(sandbox.exec("/srv/deep/tree/run.sh")).stdout == "ran\n"
    run(sandbox.download("/srv/deep/tree", tmp_path / "back"))
    assert (tmp_path / "back" / "sub" / "x.bin").read_bytes() == bytes(range(256)) * 4000


def test_download_of_a_missing_path_is_file_not_found(sandbox, tmp_path):
    with pytest.raises(FileNotFoundError, match="/nope"):
        run(sandbox.download("/nope", tmp_path / "x"))


@pytest.fixture
def host_server():
    """An HTTP server on this machine's loopback, like the proxy."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"proxy saw {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


FETCH = (
    "import sys, urllib.request; "
    "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
)


def test_loopback_pod_has_only_lo_and_reaches_the_proxy(sandbox, host_server):
    assert run(sandbox.exec("cat /proc/net/dev")).stdout.count(":") == 1  # lo only
    url = sandbox.proxy_url(host_server + "/s/abc")
    assert url.startswith("http://127.0.0.1:")
    res = run(sandbox.exec(["python3", "-c", FETCH, url]))
    assert res.stdout.strip() == "proxy saw /s/abc", res
    run(sandbox.set_network("none"))
    res = run(sandbox.exec(["python3", "-c", FETCH, url], timeout_s=20))
    assert not res.ok


def test_policy_pod_reaches_a_loopback_proxy_through_proxy_url(policy_sandbox, host_server):
    sandbox = policy_sandbox
    url = sandbox.proxy_url(host_server + "/s/abc")
    assert "127.0.0.1" not in url
    res = run(sandbox.exec(["python3", "-c", FETCH, url]))
    assert res.stdout.strip() == "proxy saw /s/abc", res
    # After the agent phase the link is cut.
    run(sandbox.set_network("none"))
    res = run(sandbox.exec(["python3", "-c", FETCH, url], timeout_s=20))
    assert not res.ok
    with pytest.raises(SandboxError, match="closed after the agent phase"):
        sandbox.proxy_url(host_server)


def test_one_pods_link_refuses_another_pod(policy_backend, policy_sandbox, host_server, trial_id):
    from k8s_support import py_task

    url = policy_sandbox.proxy_url(host_server + "/mine")
    other = run(policy_backend.start(py_task("other"), trial_id=trial_id + "-b", labels={}))
    try:
        res = run(other.exec(["python3", "-c", FETCH, url], timeout_s=20))
        assert not res.ok
    finally:
        run(other.stop())


def test_network_policy_follows_the_phases(policy_backend, policy_sandbox):
    sandbox = policy_sandbox
    net = policy_backend.api.networking
    policy = net.read_namespaced_network_policy(sandbox.name, NAMESPACE)
    assert policy.spec.pod_selector.match_labels == {LABEL_POD: sandbox.name}
    assert len(policy.spec.egress) == 1  # the proxy only
    run(sandbox.set_network("none"))
    assert net.read_namespaced_network_policy(sandbox.name, NAMESPACE).spec.egress in (None, [])
    run(sandbox.set_network("full"))
    with pytest.raises(Exception) as info:
        net.read_namespaced_network_policy(sandbox.name, NAMESPACE)
    assert getattr(info.value, "status", None) == 404


def test_pod_deleted_mid_exec_is_a_sandbox_error(backend, sandbox):
    async def delete_while_running():
        task = asyncio.ensure_future(sandbox.exec("sleep 304"))
        await _until_running(sandbox, "sleep 304", 1)
        await backend.call(
            backend.api.core.delete_namespaced_pod,
            sandbox.name,
            NAMESPACE,
            grace_period_seconds=0,
        )
        return await asyncio.wait_for(task, timeout=90)

    with pytest.raises(PodGone, match="deleted"):
        run(delete_while_running())
    with pytest.raises(SandboxError):
        run(sandbox.exec("true"))


def test_pod_spec_on_the_cluster(backend, sandbox, trial_id):
    pod = backend.api.core.read_namespaced_pod(sandbox.name, NAMESPACE)
    assert pod.metadata.labels[TRIAL] == trial_id
    assert pod.metadata.labels[RUN] == "tests"
    c = pod.spec.containers[0]
    assert c.resources.limits == {"cpu": "500m", "memory": "256Mi"}
    assert pod.spec.active_deadline_seconds == 720
    assert pod.spec.automount_service_account_token is False
    assert (
        run(sandbox.exec("test -e /var/run/secrets/kubernetes.io || echo none")).stdout == "none\n"
    )


def test_stop_deletes_the_pod_at_once(backend, trial_id):
    from k8s_support import py_task

    sb = run(backend.start(py_task(), trial_id=trial_id, labels={}))
    assert backend.list_pods(**{TRIAL: trial_id})
    run(sb.stop())
    run(sb.stop())  # idempotent
    assert backend.list_pods(**{TRIAL: trial_id}) == []


def test_bundle_folder_is_mounted_read_only(backend, tmp_path, trial_id):
    from k8s_support import py_task

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "agent").write_text("#!/bin/sh\necho agent-ran\n")
    (tmp_path / "bin" / "agent").chmod(0o755)

    async def go():
        sb = await backend.start(
            py_task(), trial_id=trial_id, labels={}, mounts={tmp_path: "/opt/slr/agent"}
        )
        try:
            ran = await sb.exec("/opt/slr/agent/bin/agent")
            write = await sb.exec("touch /opt/slr/agent/x")
            return ran, write
        finally:
            await sb.stop()

    ran, write = run(go())
    assert ran.stdout == "agent-ran\n"
    assert write.exit_code != 0 and "Read-only" in write.stderr


def test_logs_are_the_pods_own_output(sandbox):
    # network = 'loopback': the pod's main process is the proxy relay, which says when it is up.
    assert "slr-relay ready" in run(sandbox.logs())
