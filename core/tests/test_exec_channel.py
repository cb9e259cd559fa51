"""The exec server's protocol end to end, without a container: the real ``exec_server.py``
serving one end of a socket pair in a child process (as PID 1 runs it in a docker sandbox),
the real ``ExecChannel`` on the other.

The docker backend's own tests run the same server in containers and compare it with
``docker exec`` (sandbox_backends/docker/tests/test_docker_exec_server.py); these check
what does not need a daemon: concurrent commands, output of any size and a kill while it
flows, the trace of where a command's time went, a server that dies.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from slr.sandboxing import exec_server
from slr.sandboxing.exec_channel import ChannelLost, ExecChannel

pytestmark = pytest.mark.timeout(30)

SERVE = """
import socket, sys
sys.path.insert(0, sys.argv[2])
import exec_server
exec_server.ExecServer(socket.socket(fileno=int(sys.argv[1]))).serve()
"""


class ServedChannel:
    """A channel to an exec server in a child process; ``server`` is that process."""

    def __init__(self) -> None:
        host, inner = socket.socketpair()
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SERVE,
                str(inner.fileno()),
                str(Path(exec_server.__file__).parent),
            ],
            pass_fds=[inner.fileno()],
        )
        inner.close()
        self.channel = ExecChannel(host)
        self.channel.hello(["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=from the image"])

    def run(self, command: str, **kwargs):
        return self.channel.run(["bash", "-c", command], marker=uuid.uuid4().hex, **kwargs)

    def close(self) -> None:
        self.channel.close()
        self.server.kill()
        self.server.wait()


@pytest.fixture
def served():
    made: list[ServedChannel] = []

    def make() -> ServedChannel:
        made.append(ServedChannel())
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_concurrent_commands_each_get_their_own_result_and_environment(served):
    channels = [served() for _ in range(4)]

    async def all_at_once():
        return await asyncio.gather(
            *(c.run(f"echo $GREETING {i}; echo err >&2; exit {i}") for i, c in enumerate(channels))
        )

    results = asyncio.run(all_at_once())
    assert [r.exit_code for r in results] == list(range(4))
    assert [r.stdout for r in results] == [f"from the image {i}\n".encode() for i in range(4)]
    assert all(r.stderr == b"err\n" and not r.timed_out for r in results)


def test_output_of_any_size_arrives_whole_and_a_kill_ends_a_flood(served):
    s = served()
    size = 3 * exec_server.MAX_PAYLOAD + 7  # several output frames, not a multiple

    async def go():
        big = await s.run(f"head -c {size} /dev/zero | tr '\\0' x")
        flooding = await s.run("yes flood; echo never", timeout_s=0.5)
        after = await s.run("echo still serving")
        return big, flooding, after

    big, flooding, after = asyncio.run(go())
    assert big.exit_code == 0 and big.stdout == b"x" * size
    assert flooding.timed_out and flooding.exit_code == 137
    assert flooding.stdout.startswith(b"flood\n") and b"never" not in flooding.stdout
    assert after.stdout == b"still serving\n"


def test_a_command_returns_when_its_own_process_exits_not_its_leftovers(served):
    s = served()
    res = asyncio.run(s.run("echo a; (sleep 3; echo never) & echo b", timeout_s=10))
    assert (res.exit_code, res.stdout, res.timed_out) == (0, b"a\nb\n", False)


def test_a_channel_moves_to_the_next_event_loop_and_says_where_the_time_went(served):
    s = served()
    first = asyncio.run(s.run("true"))
    second = asyncio.run(s.run("exit 4"))  # a new loop, as tests drive sandboxes
    assert (first.exit_code, second.exit_code) == (0, 4)
    t = second.trace
    assert t is not None
    assert t.sent <= t.server_read <= t.started <= t.exited <= t.server_sent <= t.read


def test_commands_that_cannot_start_are_126_with_the_reason(served):
    s = served()

    async def go():
        missing = await s.channel.run(["no-such-program-xyz"], marker="m1")
        bad_cwd = await s.run("true", cwd="/no/such/folder")
        bad_user = await s.run("true", user="no-such-user-xyz")
        return missing, bad_cwd, bad_user

    for res in asyncio.run(go()):
        assert res.exit_code == 126
        assert b"cannot start" in res.stderr or b"unable to find user" in res.stderr


def test_a_server_that_dies_fails_its_running_commands_with_channel_lost(served):
    s = served()

    async def go():
        running = asyncio.ensure_future(s.run("sleep 3"))
        await s.run("true")  # the long one has started
        s.server.kill()
        with pytest.raises(ChannelLost):
            await running
        with pytest.raises(ChannelLost):
            await s.run("true")

    asyncio.run(go())
    assert s.channel.closed
