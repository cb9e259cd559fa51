"""Logging: JSON lines off a TTY, with run_id / trial_id bound through contextvars."""

from __future__ import annotations

import asyncio
import io
import json

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
