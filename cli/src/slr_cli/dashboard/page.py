"""The dashboard's one page: ``static/`` (HTML, plain JS, CSS; no build step, nothing
fetched from elsewhere) put together into a single HTML document.

The server sends it with no data (the script asks the API and follows the event stream);
``--export`` sends it with every run's snapshot and trial details inlined, so the file opens
from disk with no server.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

_STATIC = resources.files("slr_cli.dashboard") / "static"


def _asset(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element (no "</script>" or "<!--" can end it early)."""
    # a JavaScript literal, not JSON: NaN and Infinity (a metric can be either) are valid
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(data: dict[str, Any] | None) -> str:
    """The page; ``data`` (``{"runs": [snapshot, ...], "trials": {run: {trial: detail}}}``)
    makes it a static export that needs no server."""
    # data last, each placeholder once: what the data holds (logs, configs) is never
    # searched for the other placeholders
    page = _asset("index.html").replace("/*STYLE*/", _asset("dashboard.css"), 1)
    page = page.replace("/*SCRIPT*/", _asset("dashboard.js"), 1)
    return page.replace("/*DATA*/null", _script_json(data), 1)
