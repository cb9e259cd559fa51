"""Logging: JSON lines off a TTY, with run_id / trial_id bound through contextvars."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest
import structlog

from slr import log


def test_json_lines_carry_bound_ids_per_task():
    stream = io.StringIO()
    log.configure(stream=stream)

    async def trial(tid: str):
        with log.bound(trial_id=tid):
            await asyncio.sleep(0)
            structlog.get_logger().info("trial step", n=1)

    async def main():
        log.bind(run_id="r1")
        await asyncio.gather(trial("t1"), trial("t2"))

    asyncio.run(main())
    log.clear()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert {(x["run_id"], x["trial_id"]) for x in lines} == {("r1", "t1"), ("r1", "t2")}
    assert all(x["event"] == "trial step" and x["level"] == "info" for x in lines)


@pytest.fixture
def restore_logging():
    """configure() changes process-wide logging; put it back for the other tests."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    libs = {n: logging.getLogger(n) for n in log.LIBRARY_LEVELS}
    lib_saved = {n: (lg.handlers[:], lg.level, lg.propagate) for n, lg in libs.items()}
    configured = log._configured
    yield
    log._configured = configured
    root.handlers[:], root.level = saved[0], saved[1]
    for n, (handlers, level, propagate) in lib_saved.items():
        libs[n].handlers[:] = handlers
        libs[n].setLevel(level)
        libs[n].propagate = propagate


def test_library_loggers_share_the_one_stream(restore_logging, capsys):
    # transformers installs a stderr handler of its own at import; after configure, its
    # records (and verl's, httpx's, uvicorn's) come out once, as structlog lines
    from transformers.utils import logging as hf_logging

    stream = io.StringIO()
    log.configure(stream=stream)
    hf_logging.get_logger("transformers.modeling_utils").warning("weights not tied")
    logging.getLogger("verl.trainer").warning("verl says %s", "hi")
    logging.getLogger("uvicorn.error").error("port busy")
    logging.getLogger("httpx").info("HTTP Request: POST /v1 200")  # below httpx's level
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("some.lib").exception("failed")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    got = {(x["logger"], x["event"], x["level"]) for x in lines}
    assert got == {
        ("transformers.modeling_utils", "weights not tied", "warning"),
        ("verl.trainer", "verl says hi", "warning"),
        ("uvicorn.error", "port busy", "error"),
        ("some.lib", "failed", "error"),
    }
    assert "RuntimeError: boom" in next(x for x in lines if x["logger"] == "some.lib")["exception"]
    assert capsys.readouterr().err == ""  # nothing printed by the libraries' own handlers
