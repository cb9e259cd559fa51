"""The proxy link: URL mapping, forwarding over the unix socket or TCP, and cutting it; the
command-to-argv rule every backend shares."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from slr.sandboxing import (
    RELAY_SCRIPT,
    HostRelay,
    ProxyLink,
    command_argv,
    inner_proxy_url,
    remove_stale_links,
)
from slr_testkit.sandbox_probes import stand_in_proxy


@pytest.mark.parametrize(
    ("host_url", "inner", "target"),
    [
        ("http://127.0.0.1:8123/v1/s/abc", "http://127.0.0.1:47110/v1/s/abc", ("127.0.0.1", 8123)),
        ("http://localhost/v1?x=1", "http://127.0.0.1:47110/v1?x=1", ("localhost", 80)),
        ("https://proxy.internal/v1", "https://127.0.0.1:47110/v1", ("proxy.internal", 443)),
    ],
)
def test_inner_url_keeps_the_path_and_dials_the_proxy(host_url, inner, target):
    assert inner_proxy_url(host_url, 47110) == (inner, target)


def test_a_non_http_url_is_refused():
    with pytest.raises(ValueError, match="not an http"):
        inner_proxy_url("unix:///tmp/x.sock", 1)


def _http_get_over_unix(path: str, url_path: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(f"GET {url_path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_link_forwards_to_its_target_only_until_closed():
    link = ProxyLink()
    link.start()
    try:
        with stand_in_proxy() as url:
            _, target = inner_proxy_url(url, 1)
            # No target yet: the connection is closed at once, nothing is forwarded.
            try:
                assert _http_get_over_unix(str(link.socket_path), "/v1/models") == b""
            except (BrokenPipeError, ConnectionResetError):
                pass
            link.set_target(*target)
            reply = _http_get_over_unix(str(link.socket_path), "/v1/models")
            assert b"200 OK" in reply and b"slr-stand-in-proxy-ok" in reply
            link.close()
            with pytest.raises(OSError):
                _http_get_over_unix(str(link.socket_path), "/v1/models")
    finally:
        link.remove()
    assert not link.dir.exists()


def test_closing_cuts_a_connection_in_flight():
    link = ProxyLink()
    link.start()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    link.set_target("127.0.0.1", server.getsockname()[1])
    accepted = []
    t = threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True)
    t.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(link.socket_path))
    client.sendall(b"hello")
    t.join(10)
    assert accepted and accepted[0].recv(5) == b"hello"
    link.close()
    assert client.recv(10) == b""  # the agent's end sees the link go away
    client.close()
    accepted[0].close()
    server.close()
    link.remove()


def test_relay_runs_a_command_with_the_port_already_listening(tmp_path):
    link = ProxyLink(parent=str(tmp_path))
    link.start()
    try:
        with stand_in_proxy() as url:
            _, target = inner_proxy_url(url, 1)
            link.set_target(*target)
            probe = (
                "import urllib.request; "
                "print(urllib.request.urlopen('http://127.0.0.1:47199/v1/x', timeout=10).read().decode())"
            )
            res = subprocess.run(
                [
                    sys.executable,
                    str(RELAY_SCRIPT),
                    "47199",
                    str(link.socket_path),
                    "--",
                    sys.executable,
                    "-c",
                    probe,
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert res.returncode == 0, res.stderr
        assert "slr-stand-in-proxy-ok" in res.stdout
    finally:
        link.remove()


def test_stale_links_of_dead_processes_are_removed(tmp_path):
    mine = ProxyLink(parent=str(tmp_path))
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    stale = ProxyLink(parent=str(tmp_path))
    (stale.dir / "owner.pid").write_text(str(dead_pid.pid))
    assert remove_stale_links(str(tmp_path)) == 1
    assert mine.dir.exists() and not stale.dir.exists()
    mine.remove()


def test_a_string_is_a_bash_command_not_a_login_shell_and_a_list_an_argv():
    # -c, not -lc: a login shell's /etc/profile would reset the PATH the image set.
    assert command_argv("echo $PATH") == ["bash", "-c", "echo $PATH"]
    assert command_argv(("ls", "-la")) == ["ls", "-la"]
    with pytest.raises(ValueError, match="empty argv"):
        command_argv([])


def _http_get_tcp(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.0\r\nHost: x\r\n\r\n")
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_tcp_relay_forwards_only_accepted_peers_until_closed():
    """The same relay over a TCP listener (the k8s forwarder): peers it refuses get nothing."""
    allowed = {"127.0.0.1"}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    relay = HostRelay(listener, accept_peer=lambda peer: peer[0] in allowed)
    try:
        with stand_in_proxy() as url:
            relay.target = inner_proxy_url(url, 1)[1]
            assert b"slr-stand-in-proxy-ok" in _http_get_tcp(port)
            allowed.clear()
            try:
                assert _http_get_tcp(port) == b""
            except (BrokenPipeError, ConnectionResetError):
                pass
            relay.close()
            assert relay.closed and relay.target is None
            with pytest.raises(OSError):
                _http_get_tcp(port)
    finally:
        relay.close()
