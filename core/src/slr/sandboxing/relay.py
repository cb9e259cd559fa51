"""The in-sandbox end of the proxy link. Runs with the sandbox's own python3 (stdlib only).

A sandbox has no network but its loopback. This relay listens on 127.0.0.1:PORT inside the
sandbox and forwards each connection to a unix socket that the host bind-mounts into the
sandbox; the host end forwards to the proxy. The proxy is the only thing reachable.

    python3 relay.py PORT SOCKET            serve forever (a container's PID 1); prints
                                            "slr-relay ready" once listening
    python3 relay.py PORT SOCKET -- CMD...  listen, run CMD, exit with its status
    python3 relay.py PORT SOCKET --exec EXEC_SOCKET
                                            PID 1 that also serves the sandbox's commands
                                            (``exec_server.py``, beside this file)

It is copied into the sandbox and runs on the sandbox's python3, so it cannot import slr:
its pipe loop is its own copy of ``slr.sandboxing.host_relay.pipe``.
"""

import os
import signal
import socket
import subprocess
import sys
import threading

READY = "slr-relay ready"


def _pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _handle(conn, path):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        up.close()
        return
    t = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
    t.start()
    _pipe(conn, up)
    t.join()
    conn.close()
    up.close()


def _serve(listener, path):
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_handle, args=(conn, path), daemon=True).start()


def main(argv):
    port, path = int(argv[0]), argv[1]
    cmd = argv[3:] if len(argv) > 2 and argv[2] == "--" else None
    exec_socket = argv[3] if len(argv) > 3 and argv[2] == "--exec" else None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    if cmd is None:
        # PID 1 of a container: reap re-parented orphans, exit on docker stop. The exec
        # server reaps them itself: it needs its commands' exit statuses, which an ignored
        # SIGCHLD would throw away.
        if exec_socket is None or not _start_exec_server(exec_socket):
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        sys.stdout.write(READY + "\n")
        sys.stdout.flush()
        _serve(listener, path)
        return 0
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    return subprocess.call(cmd)


def _start_exec_server(exec_socket):
    try:
        import exec_server  # pyright: ignore[reportMissingImports]  (copied beside this file)
    except ImportError:
        return False
    # Dialled before the ready line: the host accepts it right after seeing that line.
    return exec_server.start(exec_socket)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
