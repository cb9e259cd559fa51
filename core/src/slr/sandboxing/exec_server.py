"""The in-sandbox exec server: runs a sandbox's commands without the daemon's exec API.

Runs inside the container's PID 1 (``relay.py --exec SOCKET``) on the sandbox's own python3,
so it is standard library only, and the host imports this same file for the frame format.
Why: every ``docker exec`` is several daemon API calls and a runtime process start; on two
cores the daemon completes ~15 of them a second whatever the number of sandboxes, so at 128
trials every command waits seconds in its queue. Here a command is one frame on a socket the
container opened at its start and one ``fork``/``exec`` in the container.

The channel: PID 1 dials ``SOCKET`` (a unix socket the host listens on in the bind-mounted
link folder) before it prints its ready line; the host accepts that one connection and
removes the listener, so nothing started later in the sandbox can reach the host end. The
server keeps ``docker exec``'s semantics: the container's environment plus the command's,
``HOME`` of the user, ``user`` as ``name|uid[:group|gid]``, ``cwd``, a new session per
command, stdin from ``/dev/null``, the result when the command's own process exits
(output of processes it left behind, still writing, is not waited for), 126 when the
command cannot start, 128 + N for a signal.

Frames, both ways: ``HEADER`` (kind, exec id, payload length) then the payload.
"""

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time

HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 1 << 20  # output goes in chunks of at most this; larger frames are refused

# host -> server
HELLO = 0  # {"env": ["K=V", ...]}: the container's configured environment (docker's Config.Env)
RUN = 1  # {"argv", "user", "cwd", "env", "marker"}
KILL = 2  # kill the command's process tree (empty payload)
# server -> host
STDOUT = 3
STDERR = 4
EXIT = 5  # {"code": int, "error": str | null, "t": [read, started, exited, sent]}
# "t": CLOCK_MONOTONIC (shared by the host and its containers) when the server read the RUN
# frame, when the command had started, when it exited, when EXIT was sent

MARKER_KEY = "SLR_EXEC_ID"
CANNOT_START = 126


def send_frame(sock, lock, kind, exec_id, payload=b""):
    with lock:
        sock.sendall(HEADER.pack(kind, exec_id, len(payload)) + payload)


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock):
    """(kind, exec id, payload), or None at the end of the stream."""
    head = recv_exact(sock, HEADER.size)
    if head is None:
        return None
    kind, exec_id, size = HEADER.unpack(head)
    if size > MAX_PAYLOAD + 4096:
        raise ValueError(f"exec channel frame of {size} bytes (most {MAX_PAYLOAD})")
    payload = recv_exact(sock, size) if size else b""
    if payload is None:
        return None
    return kind, exec_id, payload


def exit_code(status):
    """A wait status as docker reports it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def kill_tree(pgid, marker):
    """SIGKILL the command's process group and every process carrying its marker (however it
    forked, re-parented or left the group); three sweeps catch what forks during one."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    wanted = (MARKER_KEY + "=" + marker).encode()
    me = os.getpid()
    for _ in range(3):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open("/proc/" + name + "/environ", "rb") as f:
                    if wanted not in f.read().split(b"\0"):
                        continue
                os.kill(int(name), signal.SIGKILL)
                found = True
            except OSError:
                continue
        if not found:
            return


class Reaper:
    """PID 1's child reaper: collects every exited child (orphans included) and hands our
    commands' statuses to whoever waits for them. A spawn registers under the same lock it
    spawns under, so a status that arrives before the registration is never lost.

    The kernel may deliver SIGCHLD to any thread, and Python runs its handler only on the
    main thread, which sits in ``accept``; the C handler's wakeup fd is written at once
    whichever thread took the signal, so the reaper waits on that instead."""

    def __init__(self):
        self.lock = threading.Lock()
        self._waiting = {}
        self._wake, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler: the wakeup fd needs one
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        threading.Thread(target=self._loop, daemon=True).start()

    def watch(self, pid, deliver):
        """Call under ``self.lock``, in the same hold as the spawn of ``pid``."""
        self._waiting[pid] = deliver

    def _loop(self):
        while True:
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                with self.lock:
                    deliver = self._waiting.pop(pid, None)
                if deliver is not None:
                    deliver(status)
            os.read(self._wake, 512)  # until the next SIGCHLD


def resolve_user(spec, default_home):
    """(uid, gid, groups, home) for docker's ``user`` syntax; None for the server's own user."""
    import grp
    import pwd

    if not spec:
        return None
    name, _, group = spec.partition(":")
    entry = None
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise LookupError(
                "unable to find user " + name + ": no matching entries in passwd file"
            ) from None
    uid = int(name) if entry is None else entry.pw_uid
    gid = 0 if entry is None else entry.pw_gid
    home = "/" if entry is None else entry.pw_dir
    groups = [gid] if entry is None else os.getgrouplist(entry.pw_name, gid)
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise LookupError(
                "unable to find group " + group + ": no matching entries in group file"
            ) from None
        groups = [gid]
    return uid, gid, groups, home or default_home


class ExecServer:
    def __init__(self, sock):
        self.sock = sock
        self.send_lock = threading.Lock()
        self.reaper = Reaper()
        self.base_env = dict(os.environ)
        self.running = {}  # exec id -> (pgid, marker)

    def serve(self):
        try:
            while True:
                frame = recv_frame(self.sock)
                if frame is None:
                    return
                kind, exec_id, payload = frame
                if kind == HELLO:
                    env = json.loads(payload)["env"]
                    base = dict(item.split("=", 1) for item in env if "=" in item)
                    if "HOSTNAME" in os.environ:
                        base.setdefault("HOSTNAME", os.environ["HOSTNAME"])
                    self.base_env = base
                elif kind == RUN:
                    request = json.loads(payload)
                    request["t_read"] = time.monotonic()
                    threading.Thread(target=self._run, args=(exec_id, request), daemon=True).start()
                elif kind == KILL:
                    target = self.running.get(exec_id)
                    if target is not None:
                        kill_tree(*target)
        except (OSError, ValueError):
            return

    def _send(self, kind, exec_id, payload=b""):
        try:
            send_frame(self.sock, self.send_lock, kind, exec_id, payload)
        except OSError:
            pass  # the host went away: nothing to tell

    def _exit(self, exec_id, code, error=None, t=None):
        if error:
            self._send(STDERR, exec_id, (error + "\n").encode())
        now = time.monotonic()
        t = [now, now, now] if t is None else t
        body = {"code": code, "error": error, "t": [*t, now]}
        self._send(EXIT, exec_id, json.dumps(body).encode())

    def _run(self, exec_id, request):
        try:
            user = resolve_user(request.get("user"), self.base_env.get("HOME", "/"))
        except LookupError as exc:
            return self._exit(exec_id, CANNOT_START, str(exc))
        env = dict(self.base_env)
        if user is not None and "HOME" not in self.base_env:
            env["HOME"] = user[3]
        elif "HOME" not in env:
            env["HOME"] = os.environ.get("HOME", "/")
        env.update(request.get("env") or {})
        marker = request["marker"]
        env[MARKER_KEY] = marker
        done_r, done_w = os.pipe()
        kwargs = {}
        if user is not None:
            kwargs = {"user": user[0], "group": user[1], "extra_groups": user[2]}
        with self.reaper.lock:
            try:
                proc = subprocess.Popen(
                    request["argv"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=request.get("cwd") or None,
                    env=env,
                    start_new_session=True,
                    **kwargs,
                )
            except Exception as exc:  # any reason it cannot start is a 126
                os.close(done_r)
                os.close(done_w)
                return self._exit(exec_id, CANNOT_START, "cannot start the command: " + str(exc))
            started = time.monotonic()
            status = []

            def deliver(st):
                status.append(st)
                status.append(time.monotonic())
                try:
                    os.write(done_w, b"x")
                except OSError:
                    pass  # the command's thread is gone already

            self.reaper.watch(proc.pid, deliver)
            self.running[exec_id] = (proc.pid, marker)
        try:
            self._pump(exec_id, proc, done_r)
        finally:
            self.running.pop(exec_id, None)
            proc.returncode = exit_code(status[0]) if status else CANNOT_START
            os.close(done_r)
            os.close(done_w)
        exited = status[1] if status else time.monotonic()
        self._exit(exec_id, proc.returncode, None, [request["t_read"], started, exited])

    def _pump(self, exec_id, proc, done_r):
        """Forward output until the command's own process exits, then what it left in the
        pipes (what processes it left behind write later is not waited for, as docker)."""
        streams = {proc.stdout: STDOUT, proc.stderr: STDERR}
        sel = selectors.DefaultSelector()
        for f in streams:
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ)
        sel.register(done_r, selectors.EVENT_READ)
        try:
            exited = False
            while not exited:
                for key, _ in sel.select():
                    if key.fileobj == done_r:
                        exited = True
                        continue
                    if self._forward(key.fileobj, streams[key.fileobj], exec_id) is False:
                        sel.unregister(key.fileobj)  # its end: every writer closed it
            for f, kind in streams.items():
                while self._forward(f, kind, exec_id):
                    pass
        finally:
            sel.close()
            for f in streams:
                f.close()

    def _forward(self, f, kind, exec_id):
        """Send one chunk of ``f``: True if sent, None if nothing is ready, False at its end."""
        try:
            data = os.read(f.fileno(), MAX_PAYLOAD)
        except BlockingIOError:
            return None
        except (ValueError, OSError):
            return False
        if not data:
            return False
        self._send(kind, exec_id, data)
        return True


def start(path):
    """Dial the host's exec socket and serve it on a thread; False if it cannot be reached
    (the host then runs commands through the daemon). Only root can run commands as any user."""
    if os.geteuid() != 0:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return False
    threading.Thread(target=ExecServer(sock).serve, daemon=True).start()
    return True
