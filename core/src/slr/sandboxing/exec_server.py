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

One loop: a selector over the channel, every running command's output pipes and the
SIGCHLD wakeup pipe, on one thread. A sandbox shares its CPU share with every other sandbox
(under cgroup v1 all of docker's containers together weigh as much as one busy host
process), so each thread that has to wake for a command is one more wait for a CPU; here a
command wakes the loop for its frame and its exit, with no reaper thread, lock or selector
per command. Only the spawn itself runs on a thread of its own (``spawn``, measured).

Frames, both ways: ``HEADER`` (kind, exec id, payload length) then the payload. A command's
output is held until it exits (or ``FLUSH_AT`` bytes are waiting) and goes with its
``EXIT`` frame in one write.
"""

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import time

HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 1 << 20  # output goes in chunks of at most this; larger frames are refused
FLUSH_AT = 1 << 16  # output held for a running command before it is sent on

# host -> server
HELLO = 0  # {"env": ["K=V", ...]}: the container's configured environment (docker's Config.Env)
RUN = 1  # {"argv", "user", "cwd", "env", "marker"}
KILL = 2  # kill the command's process tree (empty payload)
# server -> host
STDOUT = 3
STDERR = 4
EXIT = 5  # EXIT_BODY
#: exit code, then CLOCK_MONOTONIC (shared by the host and its containers) when the server
#: read the RUN frame, when the command had started, when it exited, when EXIT was sent
EXIT_BODY = struct.Struct(">i4d")

MARKER_KEY = "SLR_EXEC_ID"
CANNOT_START = 126


def frame(kind, exec_id, payload=b""):
    return HEADER.pack(kind, exec_id, len(payload)) + payload


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


def spawn(request, env, kwargs):
    """Start a command's process from a thread of its own, and wait for it.

    Measured (docker sandboxes on a loaded two-core machine, commands back to back): the
    same ``Popen`` from the loop's own long-running thread took ~2x as long to come back as
    from a fresh thread, as the scheduler placed the vfork parent behind the container's other
    work; a thread that lives only for the spawn costs ~0.1 ms and gets the CPU sooner."""
    import threading

    box = []

    def run():
        try:
            box.append(
                subprocess.Popen(
                    request["argv"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=request.get("cwd") or None,
                    env=env,
                    start_new_session=True,
                    **kwargs,
                )
            )
        except Exception as exc:  # raised again on the loop's thread
            box.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


class Command:
    """One running command: its process, its two pipes' read ends, what they held so far."""

    def __init__(self, exec_id, proc, marker, t_recv, t_started):
        self.exec_id = exec_id
        self.proc = proc
        self.marker = marker
        self.pipes = {proc.stdout.fileno(): STDOUT, proc.stderr.fileno(): STDERR}
        # the pipes' own file objects close them, once (a bare close of the number would
        # leave them to close it again, by then perhaps another command's pipe)
        self.files = {proc.stdout.fileno(): proc.stdout, proc.stderr.fileno(): proc.stderr}
        self.held = {STDOUT: bytearray(), STDERR: bytearray()}
        self.t = [t_recv, t_started]


class ExecServer:
    """Build it on the main thread (it installs the SIGCHLD wakeup), ``serve`` on any."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.setblocking(False)
        self.base_env = dict(os.environ)
        self.by_id = {}  # exec id -> Command
        self.by_pid = {}  # pid -> Command
        self.inbox = bytearray()
        # one read buffer, reused: a fresh large one per read is an mmap and munmap each time
        self.chunk = bytearray(1 << 16)
        self.chunk_view = memoryview(self.chunk)
        self.outbox = bytearray()
        self.sel = selectors.DefaultSelector()
        # SIGCHLD: Python runs handlers on the main thread only (the relay's accept loop);
        # the C handler writes the wakeup pipe at once, whichever thread took the signal.
        self._wake, wake_w = os.pipe()
        os.set_blocking(self._wake, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler: the wakeup fd needs one
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    # -- the loop ------------------------------------------------------------------------

    def serve(self):
        """Serve until the host hangs up, then keep reaping (PID 1 collects every orphan,
        the daemon's commands' included, for the rest of the container's life)."""
        sock = self.sock
        if sock is not None:
            self.sel.register(sock, selectors.EVENT_READ, self._on_channel)
        self.sel.register(self._wake, selectors.EVENT_READ, self._on_sigchld)
        while True:
            for key, events in self.sel.select():
                try:
                    key.data(key.fd, events)
                except Exception:  # the loop is every command's: it goes on
                    if key.data == self._on_channel:
                        self._hang_up()  # a broken channel, or a frame we cannot read

    def _hang_up(self):
        if self.sock is None:
            return
        try:
            self.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        self.sock = None
        del self.outbox[:]

    def _on_channel(self, fd, events):
        if events & selectors.EVENT_WRITE:
            self._flush()
        if not events & selectors.EVENT_READ or self.sock is None:
            return
        try:
            n = self.sock.recv_into(self.chunk)
        except BlockingIOError:
            return
        if not n:
            return self._hang_up()  # the host went away: nothing left to serve
        self.inbox += self.chunk_view[:n]
        while len(self.inbox) >= HEADER.size:
            kind, exec_id, size = HEADER.unpack_from(self.inbox)
            if size > MAX_PAYLOAD + 4096:
                raise ValueError("exec channel frame of " + str(size) + " bytes")
            if len(self.inbox) < HEADER.size + size:
                break
            payload = bytes(self.inbox[HEADER.size : HEADER.size + size])
            del self.inbox[: HEADER.size + size]
            if kind == HELLO:
                env = json.loads(payload)["env"]
                base = dict(item.split("=", 1) for item in env if "=" in item)
                if "HOSTNAME" in os.environ:
                    base.setdefault("HOSTNAME", os.environ["HOSTNAME"])
                self.base_env = base
            elif kind == RUN:
                self._start(exec_id, json.loads(payload), time.monotonic())
            elif kind == KILL:
                command = self.by_id.get(exec_id)
                if command is not None:
                    kill_tree(command.proc.pid, command.marker)

    def _on_sigchld(self, fd, events):
        try:
            while os.read(self._wake, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            command = self.by_pid.pop(pid, None)  # else an orphan: reaped, nothing to tell
            if command is not None:
                self._finish(command, status)

    def _on_output(self, fd, events, command, kind):
        if fd not in command.pipes:
            return None  # closed earlier in this round (and its number perhaps reused)
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:  # every writer closed it
            self._close_pipe(command, fd)
            return None
        self._hold(command, kind, data)
        return None

    # -- commands ------------------------------------------------------------------------

    def _start(self, exec_id, request, t_recv):
        try:
            user = resolve_user(request.get("user"), self.base_env.get("HOME", "/"))
        except LookupError as exc:
            return self._refuse(exec_id, str(exc), t_recv)
        env = dict(self.base_env)
        if user is not None and "HOME" not in self.base_env:
            env["HOME"] = user[3]
        elif "HOME" not in env:
            env["HOME"] = os.environ.get("HOME", "/")
        env.update(request.get("env") or {})
        marker = request["marker"]
        env[MARKER_KEY] = marker
        kwargs = {}
        if user is not None:
            kwargs = {"user": user[0], "group": user[1], "extra_groups": user[2]}
        try:
            proc = spawn(request, env, kwargs)
        except Exception as exc:  # any reason it cannot start is a 126
            return self._refuse(exec_id, "cannot start the command: " + str(exc), t_recv)
        command = Command(exec_id, proc, marker, t_recv, time.monotonic())
        self.by_id[exec_id] = command
        self.by_pid[proc.pid] = command
        for fd, kind in command.pipes.items():
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, self._output_handler(command, kind))
        return None

    def _output_handler(self, command, kind):
        return lambda fd, events: self._on_output(fd, events, command, kind)

    def _hold(self, command, kind, data):
        held = command.held[kind]
        held += data
        if len(held) >= FLUSH_AT:
            self._send(frame(kind, command.exec_id, bytes(held)))
            del held[:]

    def _close_pipe(self, command, fd):
        if command.pipes.pop(fd, None) is None:
            return
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        command.files.pop(fd).close()

    def _finish(self, command, status):
        """The command's own process exited: what its pipes hold now goes with its EXIT
        (what processes it left behind write later is not waited for, as docker)."""
        command.t.append(time.monotonic())
        for fd, kind in list(command.pipes.items()):
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                self._hold(command, kind, data)
            self._close_pipe(command, fd)
        code = exit_code(status)
        command.proc.returncode = code  # reaped here, so Popen never waits for it
        self.by_id.pop(command.exec_id, None)
        out = bytearray()
        for kind in (STDOUT, STDERR):
            if command.held[kind]:
                out += frame(kind, command.exec_id, bytes(command.held[kind]))
        t = [*command.t, time.monotonic()]
        out += frame(EXIT, command.exec_id, EXIT_BODY.pack(code, *t))
        self._send(bytes(out))

    def _refuse(self, exec_id, error, t_recv):
        now = time.monotonic()
        body = EXIT_BODY.pack(CANNOT_START, t_recv, now, now, now)
        self._send(frame(STDERR, exec_id, (error + "\n").encode()) + frame(EXIT, exec_id, body))

    # -- sending -------------------------------------------------------------------------

    def _send(self, data):
        """Write now what the socket takes, the rest when it can take more; the loop keeps
        reading meanwhile (a KILL must get through while output waits)."""
        if self.sock is None:
            return  # the host went away: nothing to tell
        if self.outbox:
            self.outbox += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return self._hang_up()  # the host went away: nothing to tell
        if sent < len(data):
            self.outbox += data[sent:]
            self.sel.modify(
                self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, self._on_channel
            )

    def _flush(self):
        if self.sock is None:
            return
        try:
            sent = self.sock.send(self.outbox)
        except BlockingIOError:
            return
        except OSError:
            return self._hang_up()
        del self.outbox[:sent]
        if not self.outbox:
            self.sel.modify(self.sock, selectors.EVENT_READ, self._on_channel)


def start(path):
    """Dial the host's exec socket and serve it on a thread; False if it cannot be reached
    (the host then runs commands through the daemon). Only root can run commands as any user.
    Call on the main thread (see ``ExecServer``)."""
    import threading

    if os.geteuid() != 0:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return False
    threading.Thread(target=ExecServer(sock).serve, daemon=True).start()
    # SIGCHLD to the server's thread only: else the kernel may wake the main thread (the
    # relay, in accept) for each command's end, one more wait for a CPU. Threads started
    # later inherit the mask; the server's thread, started above, does not.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    return True
