"""The dashboard's litestar app: one page, a JSON API over ``data.Run``, and a live stream.

``GET /`` is the page (its script and styles inlined: the same file ``--export`` writes,
with no data in it). ``GET /api/runs`` lists the runs under the folder, ``GET
/api/runs/{run}`` is one run's snapshot (with the byte offsets it was read up to), ``GET
/api/runs/{run}/trials/{trial}`` one trial in full, and ``GET /api/runs/{run}/stream`` a
server-sent event stream from those offsets: every metrics / events line and every trial
record as it is written, read by offset (never the whole file again).

Without a token (loopback) a request must name a loopback host (a page that rebinds its own
name to 127.0.0.1 is refused). With a token every request must carry it (``Authorization: Bearer``, or ``?token=`` for
the page and its event stream, which a browser cannot give headers), compared in constant
time; anything else gets 401.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, FromQuery
from litestar.response import Stream

from slr.proxy import sse
from slr_cli.dashboard.data import Decode, Run, find_runs
from slr_cli.dashboard.page import render_page

#: How often a stream looks for appended lines and new trial records, in seconds.
POLL_S = 0.5
#: A comment line this often keeps proxies from closing an idle stream (and finds a gone client).
KEEPALIVE_S = 15.0


class Runs:
    """The runs under one folder (or one run directory), each followed by one ``Run``."""

    def __init__(self, root: Path, decode_for: Callable[[dict[str, Any]], Decode | None]) -> None:
        self.root = Path(root)
        self._decode_for = decode_for
        self._runs: dict[str, Run] = {}

    def ids(self) -> list[str]:
        return [p.name for p in find_runs(self.root)]

    def get(self, run_id: str) -> Run:
        run = self._runs.get(run_id)
        if run is None:
            paths = {p.name: p for p in find_runs(self.root)}
            if run_id not in paths:
                raise NotFoundException(f"no run {run_id!r} under {self.root}")
            run = Run(paths[run_id])
            run.decode = self._decode_for(run.config())
            self._runs[run_id] = run
        return run


#: Host names a page on loopback is reached by (a DNS-rebinding page names its own).
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _authorized(request: Request, token: str) -> bool:
    given = request.query_params.get("token") or ""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        given = header[7:].strip()
    return hmac.compare_digest(given.encode(), token.encode())


async def _stream(run: Run, offsets: dict[str, int], poll_s: float) -> AsyncIterator[bytes]:
    seen: set[str] = set()
    idle = 0.0
    while True:
        changes = await asyncio.to_thread(run.changes, offsets)
        # trials: the rows this client lacks (the first message sends them all)
        rows = [r for r in await asyncio.to_thread(run.trial_rows) if r["id"] not in seen]
        seen.update(r["id"] for r in rows)
        changes["trials"] = rows
        if any(changes.values()):
            yield sse.event({**changes, "offsets": dict(offsets)}, "update")
            idle = 0.0
        elif idle >= KEEPALIVE_S:
            yield b": keepalive\n\n"
            idle = 0.0
        await asyncio.sleep(poll_s)
        idle += poll_s


def build_app(
    root: Path,
    *,
    token: str | None = None,
    decode_for: Callable[[dict[str, Any]], Decode | None] = lambda config: None,
    poll_s: float = POLL_S,
) -> Litestar:
    """The dashboard over ``root`` (a run directory or the folder of runs)."""
    runs = Runs(root, decode_for)
    page = render_page(None)

    def check_token(request: Request) -> Response | None:
        if token is None and _host_name(request) not in LOOPBACK_NAMES:
            # no token means loopback: a request naming another host came through a
            # name that resolves here (DNS rebinding), not from this machine's browser
            return Response(
                f"400: host {_host_name(request)!r} is not this machine's loopback; open "
                "the URL the dashboard printed, or give it a --token\n",
                status_code=400,
                media_type="text/plain",
            )
        if token is not None and not _authorized(request, token):
            return Response(
                "401: this dashboard needs its token (?token=... in the URL, or "
                "Authorization: Bearer ...); it was printed when the dashboard started\n",
                status_code=401,
                media_type="text/plain",
            )
        return None

    @get("/", media_type="text/html")
    async def index() -> str:
        return page

    @get("/api/runs")
    async def list_runs() -> list[str]:
        return await asyncio.to_thread(runs.ids)

    @get("/api/runs/{run_id:str}")
    async def snapshot(run_id: FromPath[str]) -> dict[str, Any]:
        return await asyncio.to_thread(runs.get(run_id).snapshot)

    @get("/api/runs/{run_id:str}/trials/{trial_id:str}")
    async def trial(run_id: FromPath[str], trial_id: FromPath[str]) -> dict[str, Any]:
        run = runs.get(run_id)
        try:
            return await asyncio.to_thread(run.trial_detail, trial_id)
        except KeyError:
            raise NotFoundException(f"no trial {trial_id!r} in run {run_id!r}") from None

    @get("/api/runs/{run_id:str}/stream")
    async def stream(
        run_id: FromPath[str], metrics: FromQuery[int] = 0, events: FromQuery[int] = 0
    ) -> Stream:
        run = runs.get(run_id)
        offsets = {"metrics": max(metrics, 0), "events": max(events, 0)}
        return Stream(
            _stream(run, offsets, poll_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return Litestar(
        route_handlers=[index, list_runs, snapshot, trial, stream],
        before_request=check_token,
        debug=False,
    )
