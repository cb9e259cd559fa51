"""A real headless Chromium for tests, driven through chromedriver's W3C WebDriver HTTP API
with httpx (no selenium): start, open a URL, run a script, wait for a condition, screenshot.

Debian's ``chromium`` and ``chromium-driver`` (scripts/test installs them). ``find()`` says
why there is no browser, for a skip reason.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
]


def find() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or why they are missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    return "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One WebDriver session."""

    def __init__(self, client: httpx.Client, session: str) -> None:
        self._http = client
        self._base = f"/session/{session}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        res = self._http.request(method, self._base + path, json=body)
        data = res.json()
        if res.status_code != 200:
            raise RuntimeError(f"webdriver {method} {path}: {data.get('value')}")
        return data["value"]

    def get(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """Run ``script`` (a function body; ``arguments`` holds ``args``) and return its value."""
        return self._call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str, *args: Any, timeout: float = 15.0, what: str = "") -> Any:
        """Poll ``script`` until it returns something truthy; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(script, *args)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or script}")
            time.sleep(0.1)  # a poll interval, the way WebDriver waits work

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))
        print(f"screenshot: {path}")
        return path


@contextmanager
def chromium(browser: str, driver: str) -> Iterator[Browser]:
    """A fresh headless Chromium (its own profile folder) for the block, then gone."""
    port = _free_port()
    proc = subprocess.Popen(
        [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    profile = tempfile.mkdtemp(prefix="slr-chromium-")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if client.get("/status").json()["value"].get("ready"):
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("chromedriver did not start within 20 s")
                time.sleep(0.05)
            caps = {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": browser,
                    "args": [*BROWSER_ARGS, f"--user-data-dir={profile}"],
                },
            }
            res = client.post("/session", json={"capabilities": {"alwaysMatch": caps}})
            session = res.json()["value"]["sessionId"]
            try:
                yield Browser(client, session)
            finally:
                client.delete(f"/session/{session}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
