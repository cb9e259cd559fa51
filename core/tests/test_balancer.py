"""The load balancer over real embedded engines (tiny models): sticky sessions, failover.

Replicas are ``HfEngine`` instances serving a tiny random model, so every call runs real
batched generation on the replica's own worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator

import pytest
import structlog
import structlog.testing
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine

from slr.contracts import ContextOverflow, Engine, EngineUnavailable, SamplingParams
from slr.engines.balancer import LoadBalancer
from slr_testkit import tiny

PROMPT = list(range(200, 220))


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny.tiny_model(seed=1)


@pytest.fixture
def replicas(tiny_pair) -> Iterator[list[HfEngine]]:
    model, tok = tiny_pair
    engines = [
        HfEngine.from_model(copy.deepcopy(model), tok, HfEngineConfig(max_context=512))
        for _ in range(2)
    ]
    yield engines
    for engine in engines:
        asyncio.run(engine.close())


def _turns(n_sessions: int, n_turns: int, max_tokens: int = 6):
    """Agent-like sessions: each turn's prompt extends the previous prompt + completion."""

    async def session(lb: LoadBalancer, sid: str) -> list[str | None]:
        prompt = list(PROMPT)
        seen = []
        for turn in range(n_turns):
            gen = await lb.generate(
                prompt, SamplingParams(max_tokens=max_tokens, seed=turn), session_id=sid
            )
            seen.append(lb.replica_of(sid))
            prompt = [*prompt, *gen.token_ids, 300 + turn]
        return seen

    return session


def test_is_an_engine(replicas):
    lb = LoadBalancer(replicas)
    assert isinstance(lb, Engine)
    assert lb.max_context == 512
    assert asyncio.run(lb.health()) is True


def test_sessions_spread_and_stay_sticky(replicas):
    lb = LoadBalancer(replicas, names=["a", "b"])
    session = _turns(n_sessions=6, n_turns=3)

    async def run():
        return await asyncio.gather(*(session(lb, f"s{i}") for i in range(6)))

    placements = asyncio.run(run())
    for seen in placements:
        assert len(set(seen)) == 1  # every call of a session on one replica
    metrics = lb.metrics()
    assert {seen[0] for seen in placements} == {"a", "b"}
    assert metrics["replicas"]["a"]["sessions"] == metrics["replicas"]["b"]["sessions"] == 3
    assert metrics["new_sessions"] == 6
    assert metrics["sticky_hits"] == 12
    assert metrics["moves"] == 0
    # stickiness pays: each replica re-used the sessions' cached prefixes
    for engine in replicas:
        assert engine.stats()["prefix_cache_hits"] >= 6


def test_killing_a_replica_mid_run_moves_its_sessions_and_nothing_hangs(replicas):
    lb = LoadBalancer(replicas, names=["a", "b"])
    victim = replicas[0]

    async def run():
        # long generations so replica "a" is busy when it dies
        tasks = [
            asyncio.create_task(
                lb.generate(
                    PROMPT,
                    SamplingParams(max_tokens=400, seed=i, stop_token_ids=[]),
                    session_id=f"k{i}",
                )
            )
            for i in range(6)
        ]
        while victim.stats()["generated_tokens"] < 5:
            await asyncio.sleep(0.005)
        on_victim = {f"k{i}" for i in range(6) if lb.replica_of(f"k{i}") == "a"}
        assert on_victim and lb.metrics()["replicas"]["a"]["in_flight"] > 0
        await victim.close()
        gens = await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
        # the moved sessions keep working, now pinned to "b"
        again = await asyncio.wait_for(
            asyncio.gather(
                *(
                    lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id=s)
                    for s in on_victim
                )
            ),
            timeout=120,
        )
        return on_victim, gens, again

    on_victim, gens, again = asyncio.run(run())
    assert all(len(g.token_ids) >= 1 for g in [*gens, *again])
    metrics = lb.metrics()
    assert metrics["replicas"]["a"]["up"] is False
    assert "EngineUnavailable" in metrics["replicas"]["a"]["last_error"]
    assert metrics["moves"] == len(on_victim)
    assert {m.session_id for m in lb.moves} == on_victim
    assert all(m.from_replica == "a" and m.to_replica == "b" for m in lb.moves)
    assert all(lb.replica_of(s) == "b" for s in on_victim)
    assert metrics["replicas"]["a"]["in_flight"] == metrics["replicas"]["b"]["in_flight"] == 0


def test_every_replica_down_raises_promptly(replicas):
    lb = LoadBalancer(replicas)
    for engine in replicas:
        asyncio.run(engine.close())
    with pytest.raises(EngineUnavailable, match="no engine replica is up"):
        asyncio.run(asyncio.wait_for(lb.generate(PROMPT, SamplingParams()), timeout=30))
    assert asyncio.run(lb.health()) is False


def test_bad_requests_do_not_take_replicas_down(replicas):
    lb = LoadBalancer(replicas)
    with pytest.raises(ContextOverflow):
        asyncio.run(lb.generate(list(range(600)), SamplingParams(), session_id="x"))
    assert all(r["up"] for r in lb.metrics()["replicas"].values())


def test_hung_replica_times_out_and_fails_over(replicas):
    """A replica whose worker is stuck (here: blocked inside a weight update) gets no
    more than ``call_timeout_s`` before the call moves on."""
    release = threading.Event()

    class BlockingState(dict):
        def __iter__(self):
            release.wait(120)
            return super().__iter__()

    lb = LoadBalancer(replicas, names=["a", "b"], call_timeout_s=3)

    async def run():
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="h")
        assert lb.replica_of("h") == "a"  # ties go to the first replica
        stuck = asyncio.create_task(replicas[0].update_weights(BlockingState()))
        gen = await asyncio.wait_for(
            lb.generate(PROMPT, SamplingParams(max_tokens=3), session_id="h"), timeout=60
        )
        release.set()
        await stuck
        return gen

    gen = asyncio.run(run())
    assert len(gen.token_ids) == 3
    assert lb.replica_of("h") == "b"
    assert [(m.session_id, m.from_replica, m.to_replica) for m in lb.moves] == [("h", "a", "b")]
    assert "no answer within 3" in lb.metrics()["replicas"]["a"]["last_error"]
    # once healthy again it is marked up by a health check
    assert asyncio.run(lb.check_health()) == {"a": True, "b": True}


def test_update_weights_reaches_every_replica(replicas, tiny_pair):
    lb = LoadBalancer(replicas)
    state = {k: v + 0.01 for k, v in tiny_pair[0].state_dict().items()}
    version = asyncio.run(lb.update_weights(state, version=7))
    assert version == 7 and lb.weights_version == 7
    for engine in replicas:
        assert engine.weights_version == 7
        name = next(iter(state))
        assert torch.equal(engine.model.state_dict()[name], state[name])
    gen = asyncio.run(lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="v"))
    assert gen.weights_version == 7


def test_calls_without_a_session_are_spread_not_pinned(replicas):
    lb = LoadBalancer(replicas)

    async def run():
        return await asyncio.gather(
            *(lb.generate(PROMPT, SamplingParams(max_tokens=20, seed=i)) for i in range(4))
        )

    asyncio.run(run())
    metrics = lb.metrics()
    assert metrics["new_sessions"] == 0 and metrics["sticky_hits"] == 0
    assert all(r["requests"] == 2 for r in metrics["replicas"].values())


def test_stream_is_sticky_and_fails_over_before_its_first_chunk(replicas):
    lb = LoadBalancer(replicas, names=["a", "b"])
    params = SamplingParams(max_tokens=4, seed=0)

    async def run():
        first = [c async for c in lb.stream(PROMPT, params, session_id="s")]
        home = lb.replica_of("s")
        again = [c async for c in lb.stream(PROMPT, params, session_id="s")]
        assert lb.replica_of("s") == home
        dead = replicas[0] if home == "a" else replicas[1]
        await dead.close()  # its next stream fails before any chunk
        moved = [c async for c in lb.stream(PROMPT, params, session_id="s")]
        return home, first, again, moved

    home, first, again, moved = asyncio.run(run())
    ids = [tuple(t for c in chunks for t in c.token_ids) for chunks in (first, again, moved)]
    assert ids[0] == ids[1] == ids[2]  # same seed, same weights, whichever replica
    assert lb.replica_of("s") != home
    m = lb.metrics()
    assert m["failovers"] == 1 and m["moves"] == 1
    assert all(r["in_flight"] == 0 for r in m["replicas"].values())


def test_stream_failing_mid_way_ends_with_engine_unavailable(replicas):
    lb = LoadBalancer(replicas[:1], names=["a"])

    async def run():
        got = []
        with pytest.raises(EngineUnavailable, match="mid-stream"):
            async for chunk in lb.stream(PROMPT, SamplingParams(max_tokens=2000), session_id="x"):
                got.append(chunk)
                if len(got) == 2:
                    await replicas[0].close()
        return got

    got = asyncio.run(run())
    assert len(got) >= 2
    assert lb.metrics()["replicas"]["a"]["up"] is False


def test_partial_update_mode_reaches_every_replica(replicas):
    lb = LoadBalancer(replicas, names=["a", "b"])
    state = {k: v.clone() for k, v in replicas[0].model.state_dict().items()}
    version = asyncio.run(lb.update_weights(state, mode="partial"))
    assert version == 1 and [r.weights_version for r in replicas] == [1, 1]


class SwitchableStandIn:
    """A real engine a test can switch off and on: a stand-in for a replica whose process
    crashed and was restarted (its calls fail and its health is False while off). It notes
    the weights version its engine served each call that reached it."""

    def __init__(self, engine: HfEngine) -> None:
        self.engine = engine
        self.off = False
        self.served: list[int] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        if self.off:
            raise EngineUnavailable("switched off")
        self.served.append(self.engine.weights_version)
        return await self.engine.generate(prompt_ids, sampling, session_id=session_id)

    async def update_weights(self, state_dict, *, version=None, mode="drain"):
        if self.off:
            raise EngineUnavailable("switched off")
        return await self.engine.update_weights(state_dict, version=version, mode=mode)

    async def health(self) -> bool:
        return not self.off


@pytest.mark.timeout(60)
def test_a_recovered_replica_is_readmitted_by_the_periodic_probe(replicas):
    a = SwitchableStandIn(replicas[0])
    lb = LoadBalancer([a, replicas[1]], names=["a", "b"], probe_interval_s=0.01)

    def a_is_up() -> bool:
        return lb.metrics()["replicas"]["a"]["up"]

    async def run():
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s1")
        assert lb.replica_of("s1") == "a"
        a.off = True
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s1")
        assert not a_is_up() and lb.replica_of("s1") == "b"
        a.off = False  # the replica came back: the balancer's own probe notices
        await asyncio.wait_for(lb.wait_until(a_is_up), timeout=30)
        # a new session takes the least-loaded replica again, the recovered one
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s2")
        return lb.replica_of("s2")

    assert asyncio.run(run()) == "a"
    metrics = lb.metrics()
    assert metrics["readmissions"] == 1 and metrics["moves"] == 1
    assert lb.replica_of("s1") == "b"  # moved sessions stay where they went


def test_without_the_probe_a_down_replica_waits_for_check_health(replicas):
    a = SwitchableStandIn(replicas[0])
    lb = LoadBalancer([a, replicas[1]], names=["a", "b"], probe_interval_s=None)

    async def run():
        a.off = True
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s1")
        a.off = False
        still_down = lb.metrics()["replicas"]["a"]["up"]
        return still_down, await lb.probe_down()

    still_down, back = asyncio.run(run())
    assert still_down is False and back == ["a"]
    assert lb.metrics()["replicas"]["a"]["up"] is True


def test_closing_a_proxy_session_unpins_it_from_the_balancer(replicas):
    from slr.config import ProxySection
    from slr.proxy import Proxy

    lb = LoadBalancer(replicas, names=["a", "b"])

    async def run():
        async with Proxy(lb, ProxySection(), sampling=SamplingParams(max_tokens=2)) as proxy:
            session = proxy.open_session("forget-me")
            sid = session.engine_id  # the engine never sees the session's secret token
            await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id=sid)
            pinned = lb.replica_of(sid)
            proxy.close_session(session)
            return sid, pinned

    token, pinned = asyncio.run(run())
    assert pinned is not None and lb.replica_of(token) is None
    assert sum(r["sessions"] for r in lb.metrics()["replicas"].values()) == 0


def test_publish_prepares_the_state_dict_once_for_every_replica(replicas, tiny_pair):
    model, _ = tiny_pair
    published = []

    def publish(state_dict):
        published.append(state_dict)
        return {k: v.clone() for k, v in state_dict.items()}

    lb = LoadBalancer(replicas, names=["a", "b"], publish=publish)
    version = asyncio.run(lb.update_weights(model.state_dict(), version=3))
    assert version == 3 and len(published) == 1
    assert [r.weights_version for r in replicas] == [3, 3]


def _nudged(model) -> dict[str, torch.Tensor]:
    return {k: v + 0.01 for k, v in model.state_dict().items()}


@pytest.mark.timeout(120)
def test_a_replica_down_during_an_update_serves_the_new_version_before_any_request(
    replicas, tiny_pair
):
    a = SwitchableStandIn(replicas[0])
    lb = LoadBalancer([a, replicas[1]], names=["a", "b"], probe_interval_s=0.01)
    state = _nudged(tiny_pair[0])
    at_readmission: list[int] = []

    def a_is_up() -> bool:
        up = lb.metrics()["replicas"]["a"]["up"]
        if up:  # checked the moment it is readmitted, before any call can reach it
            at_readmission.append(replicas[0].weights_version)
        return up

    async def run():
        a.off = True
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s1")
        assert lb.replica_of("s1") == "b" and not lb.metrics()["replicas"]["a"]["up"]
        assert await lb.update_weights(state, version=7) == 7  # "a" is down: not reached
        behind = lb.metrics()
        a.off = False  # back, still on the old weights: the probe brings it up to date
        await asyncio.wait_for(lb.wait_until(a_is_up), timeout=60)
        gen = await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s2")
        return behind, gen

    behind, gen = asyncio.run(run())
    # readmitted only once it served the update, with the update's weights
    assert at_readmission[0] == 7
    name = next(iter(state))
    assert torch.equal(replicas[0].model.state_dict()[name], state[name])
    assert lb.replica_of("s2") == "a" and gen.weights_version == 7
    assert a.served == [7]  # every call that reached it after it came back
    assert lb.weights_versions == {"a": 7, "b": 7}
    # while it was down, the mismatch was visible
    assert behind["published_version"] == 7
    assert behind["replicas"]["a"]["weights_version"] == 0
    assert behind["replicas"]["b"]["weights_version"] == 7
    metrics = lb.metrics()
    assert metrics["readmissions"] == 1 and metrics["weights_restored"] == 1


class LiveState(dict):
    """An export that reads the trainer's parameters when read (as verl's does): the
    balancer must not send it again later as the version it was published as."""

    def reads_live_parameters(self) -> bool:
        return True


def test_a_replica_that_cannot_be_resent_the_update_waits_out_of_service_for_the_next(
    replicas, tiny_pair
):
    a = SwitchableStandIn(replicas[0])
    lb = LoadBalancer([a, replicas[1]], names=["a", "b"], probe_interval_s=None)

    async def run():
        a.off = True
        await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id="s1")
        await lb.update_weights(LiveState(_nudged(tiny_pair[0])), version=4)
        a.off = False
        with structlog.testing.capture_logs() as logs:
            back = await lb.probe_down()
        waiting = lb.metrics()["replicas"]["a"]
        gens = [
            await lb.generate(PROMPT, SamplingParams(max_tokens=2), session_id=f"w{i}")
            for i in range(3)
        ]
        version = await lb.update_weights(_nudged(tiny_pair[0]), version=5)
        return back, logs, waiting, gens, version

    back, logs, waiting, gens, version = asyncio.run(run())
    assert back == [] and waiting["up"] is False and waiting["awaiting_update"] is True
    assert waiting["weights_version"] == 0 and "cannot be sent again" in waiting["last_error"]
    [warning] = [e for e in logs if e.get("replica") == "a"]
    assert warning["log_level"] == "warning" and warning["published_version"] == 4
    assert a.served == [] and all(g.weights_version == 4 for g in gens)  # all on "b"
    # the next update reaches it, and it is back
    assert version == 5 and lb.metrics()["replicas"]["a"]["up"] is True
    assert lb.weights_versions == {"a": 5, "b": 5}
