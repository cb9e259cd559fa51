"""A Python interpreter started ahead of its trial, and the launcher that hands it the trial.

This file runs inside the sandbox on the scaffold's own interpreter (the bundle's Python),
standard library only; ``slr.agents.prestart`` uploads it. It never imports slr.

``serve DIR MODULE...``: import the modules (the scaffold's heavy imports, paid while the
sandbox waits in the warm pool; a name starting with ``?`` is optional: one that does not
import is skipped with a line on stderr, others fail the start), listen on ``DIR/sock``, say ``ready`` on the ``DIR/ready``
fifo, and wait for one launch. A launch brings an argv, an environment, a working folder
and the launcher's stdin, stdout and stderr (passed as file descriptors): the interpreter
takes them over, and runs ``argv[0]`` as ``__main__``, exactly as ``python ARGV...`` would
have, then reports its exit status and exits. It serves one launch, never a second.

``run DIR ARGV...``: the launcher, the trial's command. It hands its own stdio, environment
and folder to the waiting interpreter and exits with the status it reports, so the trial
sees what a fresh ``python ARGV...`` would have printed and returned. The launcher's
connection is the interpreter's lifeline: when the launcher dies (the trial's timeout
killed it, the trial was cancelled), the interpreter kills its own process group at once.
Exit 75 with ``UNAVAILABLE`` on stderr: no interpreter is waiting (nothing ran).

With ``SLR_FREEZE_IMPORTS=1`` in its environment (``FREEZE_IMPORTS_ENV``, the adapters'
``freeze_imports``), ``serve`` imports its modules with the cyclic garbage collector paused
and then freezes what they made (``frozen_imports``).
"""

import atexit
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import threading

UNAVAILABLE = "slr-prestart: no prestarted interpreter is waiting"
UNAVAILABLE_EXIT = 75  # EX_TEMPFAIL: nothing ran, run the command afresh
_MAX_MESSAGE = 1 << 20
#: The environment variable that turns ``frozen_imports`` on ("1"); the scaffolds' drivers
#: read the same name (they run without slr).
FREEZE_IMPORTS_ENV = "SLR_FREEZE_IMPORTS"


@contextlib.contextmanager
def frozen_imports(on=True):
    """Import with the cyclic garbage collector paused, then freeze what was made.

    A scaffold's import creates over half a million objects (classes, functions, pydantic
    schemas) that live as long as the process; the collector scans them again and again
    while they are made (16-20% of the import's CPU for litellm's 3,000 modules) and in
    every full collection after. Pausing it during the import and moving them into its
    permanent generation afterwards (``gc.freeze``, as pre-forking servers do) skips that
    work; nothing the program does changes, and only the cycles made during the import
    (a few dozen objects) are never collected.
    """
    if not on:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _exit_code(code):
    """The process exit status ``sys.exit(code)`` would give."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve(folder, modules):
    import importlib

    try:
        os.setsid()  # a process group of its own: the lifeline ends exactly it
    except OSError:
        pass
    state = {"code": None, "conn": None, "finished": False}

    def report():
        # Registered first, so it runs last: after the program's own exit handlers.
        conn = state["conn"]
        if conn is None:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        state["finished"] = True
        try:
            conn.send(str(state["code"]).encode())
            conn.close()
        except OSError:
            pass

    atexit.register(report)
    with frozen_imports(os.environ.get(FREEZE_IMPORTS_ENV) == "1"):
        for name in modules:
            try:
                importlib.import_module(name.lstrip("?"))
            except ImportError as exc:
                if not name.startswith("?"):
                    raise
                print(f"slr-prestart: skipped {name[1:]} ({exc})", file=sys.stderr)
    path = os.path.join(folder, "sock")
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(1)
    with open(os.path.join(folder, "ready"), "w") as ready:  # waits for the pool's probe
        ready.write("ready\n")
    conn, _ = listener.accept()
    listener.close()
    os.unlink(path)  # one launch only: a second launcher finds nothing
    message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
    launch = json.loads(message)
    state["conn"] = conn

    def lifeline():
        # Blocks until the launcher's end of the connection closes.
        try:
            conn.recv(16)
        except OSError:
            pass
        if not state["finished"]:
            os.killpg(os.getpgid(0), signal.SIGKILL)

    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(launch["cwd"])
    os.environ.clear()
    os.environ.update(launch["env"])
    sys.argv = list(launch["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    threading.Thread(target=lifeline, daemon=True).start()

    import runpy
    import traceback

    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    state["code"] = code
    sys.exit(code)


def run(folder, argv):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(os.path.join(folder, "sock"))
    except OSError as exc:
        print(f"{UNAVAILABLE} ({exc})", file=sys.stderr)
        return UNAVAILABLE_EXIT
    launch = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(launch).encode()], [0, 1, 2])
    status = conn.recv(16)
    if not status:
        print("slr-prestart: the prestarted interpreter died without an exit status",
              file=sys.stderr)  # fmt: skip
        return 128 + signal.SIGKILL
    return int(status)


if __name__ == "__main__":
    mode, folder, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "serve":
        serve(folder, rest)
    elif mode == "run":
        sys.exit(run(folder, rest[1:] if rest[:1] == ["--"] else rest))
    else:
        sys.exit(f"usage: {sys.argv[0]} serve DIR MODULE... | run DIR -- ARGV...")
