"""A response's head goes out with its body (``slr.proxy.transport.HeadWithBody``).

The transport under the wrapper records each ``write`` (one ``write`` is one send on a
socket with TCP_NODELAY); the event loop is a real one.
"""

from __future__ import annotations

import asyncio

import pytest

from slr.proxy.transport import HeadWithBody

pytestmark = pytest.mark.timeout(10)

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    """Stands in for the socket's transport: keeps what was written, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def run(steps):
    """Each of ``steps`` runs in its own step of the loop; returns the recorded writes."""

    async def go():
        loop = asyncio.get_running_loop()
        raw = RecordingTransport()
        wrapped = HeadWithBody(raw, loop)  # type: ignore[arg-type]
        for step in steps:
            step(wrapped)
            await asyncio.sleep(0)  # one step of the loop: the held head's flush runs
        return raw

    return asyncio.run(go())


def test_head_and_body_written_in_one_step_are_one_send():
    raw = run([lambda t: (t.write(HEAD), t.write(b"{}"), t.write(b""))])
    assert raw.writes == [HEAD + b"{}"]


def test_a_head_without_a_body_in_its_step_goes_out_at_the_end_of_the_step():
    raw = run([lambda t: t.write(HEAD), lambda t: t.write(b"data: 1\n\n")])
    assert raw.writes == [HEAD, b"data: 1\n\n"]


def test_close_sends_a_held_head_first_and_abort_drops_it():
    closed = run([lambda t: (t.write(HEAD), t.close())])
    assert closed.writes == [HEAD] and closed.closed
    aborted = run([lambda t: (t.write(HEAD), t.abort())])
    assert aborted.writes == [] and aborted.aborted


def test_everything_else_passes_through():
    raw = run([lambda t: t.write(b"not a head")])
    assert raw.writes == [b"not a head"]
    loop = asyncio.new_event_loop()
    try:
        wrapped = HeadWithBody(RecordingTransport(), loop)  # type: ignore[arg-type]
        assert wrapped.get_extra_info("peername") == ("127.0.0.1", 1)
        assert not wrapped.is_closing()
    finally:
        loop.close()
