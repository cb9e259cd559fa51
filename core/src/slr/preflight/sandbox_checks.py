"""The core's ``proxy-reach`` check: a sandbox of the configured backend reaches the proxy.

Every backend has its own way in (a unix-socket relay for docker and bubblewrap, a pod's
route for k8s); when it is broken every trial ends without one model call, which reads as
"reward all zero". The check does what a trial does, with a throwaway listener in place of
the proxy: it listens where the proxy would (``proxy.host``, a free port), starts a sandbox
of the first task through the backend's ``prepare`` / ``start``, asks the sandbox for the
proxy's URL (``Sandbox.proxy_url``) and fetches it from inside. Cheap and bounded by
``PROBE_TIMEOUT_S``; when it cannot be decided (the image is still to be built, the image has
no python3) it warns instead of failing.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import secrets
import threading
import uuid
from typing import Any

from slr.hookspecs import hookimpl
from slr.preflight import CheckResult, Context, fatal, ok, warn

PROBE_TIMEOUT_S = 60.0
DOC = "docs/troubleshooting/sandboxes.md#the-agent-never-reaches-the-proxy"
# Runs inside the sandbox: fetch the URL, print what came back (or the error).
FETCH = r"""
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except Exception as exc:
    print(f"error: {exc}")
"""


class _Listener(http.server.ThreadingHTTPServer):
    token = ""


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        listener = self.server
        assert isinstance(listener, _Listener)
        body = json.dumps({"probe": listener.token}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def _probe(backend: Any, task: Any, url: str, token: str) -> CheckResult:
    from slr.sandboxing.labels import trial_labels

    trial_id = f"preflight-{uuid.uuid4().hex[:8]}"
    await backend.prepare(task)
    sandbox = await backend.start(
        task,
        trial_id=trial_id,
        labels=trial_labels(run_id="preflight", trial_id=trial_id, task_id=task.id),
    )
    try:
        inner = sandbox.proxy_url(url)
        res = await sandbox.exec(["python3", "-c", FETCH, inner], timeout_s=30)
    finally:
        await sandbox.stop()
    said = (res.stdout or res.stderr).strip()
    if res.exit_code != 0 and "error:" not in said:
        return warn(
            f"could not decide: the probe did not run in a sandbox of task {task.id!r} "
            f"(exit {res.exit_code}: {said[-160:]}; it needs python3 in the image)",
            fix="check a real trial's transcript after the first step",
            doc=DOC,
        )
    if token not in said:
        return fatal(
            f"a sandbox of task {task.id!r} does not reach the proxy: {inner} (for {url} on "
            f"the host) answered {said[-200:]!r}",
            fix="set proxy.host to an address the backend's sandboxes reach (127.0.0.1 for "
            "the local and docker backends, this node's address for k8s)",
            doc=DOC,
        )
    return ok(f"a sandbox of task {task.id!r} reaches the proxy ({url} inside as {inner})")


def check_proxy_reach(ctx: Context) -> CheckResult | None:
    if not ctx.needs_engine():
        return None  # no model call, no proxy
    from slr.errors import SlrError
    from slr.tasks import load_tasks

    cfg = ctx.config
    try:
        tasks = load_tasks(cfg.tasks.path, include=cfg.tasks.include, split=cfg.tasks.split)
    except SlrError:
        return None  # the tasks check reports it
    if not tasks:
        return None
    ctx.plugins.get("sandbox_backend", cfg.backend.name)  # unknown: fails here, before the listener
    token = secrets.token_hex(8)
    server = _Listener((cfg.proxy.host, 0), _Handler)
    server.token = token
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://{cfg.proxy.host}:{server.server_address[1]}/v1"

    async def main() -> CheckResult:
        backend = ctx.plugins.build(cfg, "backend")
        try:
            return await asyncio.wait_for(_probe(backend, tasks[0], url, token), PROBE_TIMEOUT_S)
        finally:
            await backend.close()

    try:
        return asyncio.run(main())
    except TimeoutError:
        return warn(
            f"could not decide within {PROBE_TIMEOUT_S:.0f} s (building task {tasks[0].id!r}'s "
            f"environment first?)",
            fix="build the images ahead, then run `slr preflight` again",
            doc=DOC,
        )
    except SlrError as exc:
        return warn(f"could not decide: {exc}", fix="see the backend's own check above", doc=DOC)
    except Exception as exc:  # a backend's start-up failure is its own check's finding
        return warn(
            f"could not decide: a sandbox did not start ({type(exc).__name__}: {exc})",
            fix="see the backend's own check above",
            doc=DOC,
        )
    finally:
        server.shutdown()
        server.server_close()


@hookimpl
def register_preflight_checks(register):
    register("proxy-reach", check_proxy_reach, stage="data")
