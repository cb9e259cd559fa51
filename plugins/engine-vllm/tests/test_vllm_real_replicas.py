"""Two REAL vLLM servers behind the balancer, as ``[engine] replicas = 2`` launches them:
sessions stick to one server (the servers' own request counters agree with the
balancer's routing), and a server SIGKILLed while it generates for a session costs that
call nothing but a retry on the other server, where the session then stays.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from slr_engine_vllm.engine import create_engine
from vllm_real_support import metric, prompt_of, running, vllm_config

from slr.contracts import SamplingParams
from slr.engines.balancer import LoadBalancer
from slr.plugins import PluginManager

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def _served(url: str) -> float:
    """Requests the server itself finished (vLLM's ``request_success`` counter)."""
    return metric(url, "vllm:request_success_total")


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    """``replicas = 2`` through the registered plugin, as ``slr run`` builds the engine."""
    registration = PluginManager().get("engine", "vllm")
    assert registration.plugin.distribution == "slr-engine-vllm"
    assert registration.load() is create_engine
    config = vllm_config(tmp_path_factory.mktemp("vllm-replicas"), replicas=2)
    engine = registration.create(config)
    assert isinstance(engine, LoadBalancer)
    yield engine
    asyncio.run(engine.close())


def test_sessions_stick_to_one_real_server(two_servers, record):
    balancer = two_servers
    engines = dict(balancer.replicas)
    urls = {name: e.url for name, e in engines.items()}  # pyright: ignore[reportAttributeAccessIssue]
    assert len(set(urls.values())) == 2
    before = {name: _served(url) for name, url in urls.items()}
    prompt = prompt_of(next(iter(engines.values())), "Name a prime number.")
    sessions = [f"session-{i}" for i in range(4)]

    async def three_turns():
        pins = []
        for turn in range(3):
            await asyncio.gather(
                *(
                    balancer.generate(prompt, SamplingParams(max_tokens=6, seed=turn), session_id=s)
                    for s in sessions
                )
            )
            pins.append({s: balancer.replica_of(s) for s in sessions})
        return pins

    pins = asyncio.run(three_turns())
    assert pins[0] == pins[1] == pins[2], pins  # every session on the same server each turn
    assert set(pins[0].values()) == set(urls), pins  # both servers took sessions
    served = {name: _served(url) - before[name] for name, url in urls.items()}
    expected = {name: 3.0 * list(pins[0].values()).count(name) for name in urls}
    record("vllm two replicas: requests per server", **served)
    assert served == expected, (served, expected)  # what each real server itself counted


def test_a_server_killed_mid_generation_fails_the_call_over(two_servers, record):
    balancer = two_servers
    engines = dict(balancer.replicas)
    prompt = prompt_of(next(iter(engines.values())), "Count from one to one hundred, in words.")
    params = SamplingParams(max_tokens=300, temperature=1.0, seed=5)

    async def scenario():
        call = asyncio.create_task(balancer.generate(prompt, params, session_id="victim"))
        while (victim := balancer.replica_of("victim")) is None:
            await asyncio.sleep(0.01)
        engine = engines[victim]
        url = engine.url  # pyright: ignore[reportAttributeAccessIssue]
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(running, url) < 1:  # the server generates for it now
            assert time.monotonic() < deadline and not call.done(), "never ran on its server"
            await asyncio.sleep(0.05)
        server = engine.server  # pyright: ignore[reportAttributeAccessIssue]
        os.killpg(server.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        gen = await call
        recovered_s = time.monotonic() - killed_at
        # the run goes on: a new session is served by the survivor
        again = await balancer.generate(prompt, SamplingParams(max_tokens=4), session_id="new")
        return victim, gen, recovered_s, server, again

    victim, gen, recovered_s, server, again = asyncio.run(scenario())
    survivor = next(name for name in engines if name != victim)
    record(
        "vllm replica killed mid-generation", retry_done_s=recovered_s, tokens=len(gen.token_ids)
    )
    assert server.process.wait(30) == -signal.SIGKILL  # really killed, not finished
    assert len(gen.token_ids) > 0 and gen.finish_reason in ("length", "stop")
    assert balancer.replica_of("victim") == survivor  # the session moved
    assert [(m.from_replica, m.to_replica) for m in balancer.moves][-1:] == [(victim, survivor)]
    state = balancer.metrics()["replicas"]
    assert state[victim]["up"] is False and state[survivor]["up"] is True
    assert len(again.token_ids) > 0 and balancer.replica_of("new") == survivor
