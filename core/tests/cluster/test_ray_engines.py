"""Engine replicas as Ray actors on a simulated two-engine-node cluster (slr.cluster).

The replicas serve a tiny random model saved to a folder, built from the run config inside
each actor's own process by the ``hf`` plugin, exactly as ``slr run`` builds them with
``[run] engine_replicas = 2``. The cluster (``ray_cluster``) starts once per test session;
the replicas start once for this module, and the last test kills one of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import attrs
import pytest

from slr.cluster.engines import RayEngine, build_engine
from slr.config import load_config
from slr.contracts import EngineUnavailable, SamplingParams
from slr.engines.balancer import LoadBalancer
from slr.plugins import get_plugin_manager
from slr_testkit import EngineTests, tiny

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

PROMPT = list(range(200, 220))
LONG = SamplingParams(max_tokens=1500, temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    model, tok = tiny.tiny_model(seed=0)
    return tiny.save(model, tok, tmp_path_factory.mktemp("tiny") / "model")


def replica_config(folder, replicas: int = 2):
    data = {
        "run": {"engine_replicas": replicas, "engine_resources": {"engine": 1}},
        "engine": {"name": "hf", "model": str(folder), "max_batch": 4, "threads": 1},
    }
    return load_config(data=data, plugins=get_plugin_manager(), only_plugins=("engine",))


@pytest.fixture(scope="module")
def balancer(ray_cluster, model_folder) -> Iterator[LoadBalancer]:
    lb = build_engine(replica_config(model_folder), get_plugin_manager())
    assert isinstance(lb, LoadBalancer)
    yield lb
    asyncio.run(lb.close())


def replicas(lb: LoadBalancer) -> list[RayEngine]:
    return [r.engine for r in lb._replicas]  # pyright: ignore[reportAttributeAccessIssue]


class TestRayEngineConformance(EngineTests):
    @pytest.fixture
    def engine(self, balancer):
        return balancer


def test_replicas_are_actors_on_the_two_engine_nodes(balancer, ray_cluster):
    engines = replicas(balancer)
    assert all(isinstance(e, RayEngine) for e in engines)
    nodes = [e.node_id for e in engines]
    assert len(set(nodes)) == 2 and set(nodes) == set(ray_cluster.node_ids("engine"))
    assert all(e.pid != __import__("os").getpid() for e in engines)


def test_replicas_no_node_can_hold_fail_at_once_naming_the_resource(ray_cluster, model_folder):
    from slr.cluster.engines import start_engine_replicas
    from slr.errors import UsageError

    config = replica_config(model_folder, replicas=1)
    config = attrs.evolve(config, run=attrs.evolve(config.run, engine_resources={"engine": 2}))
    with pytest.raises(UsageError) as info:
        start_engine_replicas(config)
    assert "engine = 2" in str(info.value) and "engine: 1, 1, 0, 0" in str(info.value)


def test_a_consumer_that_stops_cancels_the_generation_in_the_actor(balancer):
    engine = replicas(balancer)[0]

    async def run():
        before = await engine.stats()
        chunks = engine.stream(PROMPT, LONG, session_id="cancel-me")
        first = await anext(chunks)
        assert first.finish_reason is None
        await chunks.aclose()
        # the actor frees the sequence at its next token boundary
        for _ in range(600):
            after = await engine.stats()
            if after["cancelled"] > before["cancelled"] and after["load"] == 0:
                return before, after
            await asyncio.sleep(0.05)
        return before, await engine.stats()

    before, after = asyncio.run(run())
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["load"] == 0
    assert after["generated_tokens"] - before["generated_tokens"] < LONG.max_tokens


def test_a_cancelled_generate_stops_the_generation_in_the_actor(balancer):
    """``generate`` is one actor call (no stream of objects); cancelling its caller (a
    client gone, a session closed) cancels the actor's task, which frees the sequence."""
    engine = replicas(balancer)[0]

    async def until(condition):
        for _ in range(600):
            stats = await engine.stats()
            if condition(stats):
                return stats
            await asyncio.sleep(0.05)
        return await engine.stats()

    async def run():
        before = await engine.stats()
        call = asyncio.ensure_future(engine.generate(PROMPT, LONG, session_id="cancel-call"))
        running = await until(lambda s: s["generated_tokens"] > before["generated_tokens"])
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        after = await until(lambda s: s["cancelled"] > before["cancelled"] and s["load"] == 0)
        return before, running, after

    before, running, after = asyncio.run(run())
    assert running["load"] == 1
    assert after["cancelled"] == before["cancelled"] + 1 and after["load"] == 0
    assert after["generated_tokens"] - before["generated_tokens"] < LONG.max_tokens


def test_replicas_decode_below_the_driver_cpu_priority(balancer):
    """A replica's decoding is batch work: its threads run at Ray's worker niceness, so
    on shared cores the driver's proxy loop is scheduled first (docs/engines.md)."""
    import os

    assert all(e.info["nice"] > os.getpriority(os.PRIO_PROCESS, 0) for e in replicas(balancer))


def test_weights_are_published_once_and_served_by_both_replicas(balancer, monkeypatch):
    import ray
    import torch

    other, _ = tiny.tiny_model(seed=7)
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    greedy = SamplingParams(max_tokens=8, temperature=0.0)

    async def run():
        engines = replicas(balancer)
        old = [await e.generate(PROMPT, greedy) for e in engines]
        version = await balancer.update_weights(
            {k: v.detach().clone() for k, v in other.state_dict().items()}, version=41
        )
        new = [await e.generate(PROMPT, greedy) for e in engines]
        return version, old, new

    version, old, new = asyncio.run(run())
    assert version == 41 and len(puts) == 1
    assert [e.weights_version for e in replicas(balancer)] == [41, 41]
    assert new[0].token_ids == new[1].token_ids != old[0].token_ids
    assert set(new[0].weights_versions) == set(new[1].weights_versions) == {41}
    with torch.no_grad():  # what the new weights give locally, greedily
        ids = torch.tensor([PROMPT])
        out = other.generate(ids, max_new_tokens=8, do_sample=False)
    assert list(new[0].token_ids) == out[0, len(PROMPT) :].tolist()[: len(new[0].token_ids)]


def test_killing_a_replica_mid_stream_moves_the_session_and_it_comes_back(balancer):
    import ray
    import torch

    # weights of its own, published before the crash: the restarted replica must serve
    # these, not its model folder's (whatever ran before this test, or nothing)
    other, _ = tiny.tiny_model(seed=11)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)

    async def run():
        published = await balancer.update_weights(
            {k: v.detach().clone() for k, v in other.state_dict().items()},
            version=balancer.weights_version + 17,
        )
        chunks = balancer.stream(PROMPT, LONG, session_id="victim")
        await anext(chunks)
        name = balancer.replica_of("victim")
        victim = next(e for e in replicas(balancer) if e.name == name)
        ray.kill(victim.actor, no_restart=False)  # Ray restarts it: a crash, then recovery
        with pytest.raises(EngineUnavailable):
            async for _ in chunks:
                pass
        again = await balancer.generate(PROMPT, SamplingParams(max_tokens=3), session_id="victim")
        moved_to = balancer.replica_of("victim")

        def back() -> bool:
            return balancer.metrics()["replicas"][name]["up"]

        await asyncio.wait_for(balancer.wait_until(back), timeout=120)
        restored = await victim.actor.weights_version.remote()
        served = await victim.generate(PROMPT, greedy)
        return published, name, moved_to, again, restored, served

    published, name, moved_to, again, restored, served = asyncio.run(run())
    assert moved_to is not None and moved_to != name and len(again.token_ids) >= 1
    metrics = balancer.metrics()
    assert metrics["moves"] >= 1
    assert any(m["session_id"] == "victim" and m["from"] == name for m in metrics["recent_moves"])
    assert metrics["readmissions"] >= 1
    # the restarted replica was brought to the weights published before the crash: their
    # version, and their tokens (what those weights give locally, greedily)
    assert restored == published == balancer.weights_version
    assert set(served.weights_versions) == {published}
    with torch.no_grad():
        out = other.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)
    assert list(served.token_ids) == out[0, len(PROMPT) :].tolist()[: len(served.token_ids)]


def test_another_process_view_of_the_replicas_fails_over_and_owns_none(balancer):
    """What a rollout worker's node-local proxy stands on: a balancer over the replicas'
    actor handles (``attach_replicas``). A replica killed mid-stream moves its session;
    closing the view ends no replica."""
    import ray

    from slr.cluster.engines import attach_replicas, replica_handles

    handles = replica_handles(balancer)
    assert [h.name for h in handles] == ["engine-0", "engine-1"]
    assert all(h.info["weights_version"] == balancer.weights_version for h in handles)

    async def run():
        view = attach_replicas(handles, probe_interval_s=None)
        assert view.weights_version == balancer.weights_version  # no round trip needed
        chunks = view.stream(PROMPT, LONG, session_id="worker-session")
        await anext(chunks)
        name = view.replica_of("worker-session")
        victim = next(h for h in handles if h.name == name)
        ray.kill(victim.actor, no_restart=False)  # a crash; Ray restarts it
        with pytest.raises(EngineUnavailable):
            async for _ in chunks:
                pass
        again = await view.generate(
            PROMPT, SamplingParams(max_tokens=3), session_id="worker-session"
        )
        moved_to = view.replica_of("worker-session")
        moves = view.metrics()["moves"]
        await view.close()
        # the view owned nothing: the driver's balancer still reaches the survivor
        survivor = await balancer.generate(PROMPT, SamplingParams(max_tokens=2), session_id="d")
        await asyncio.wait_for(
            balancer.wait_until(
                lambda: all(r["up"] for r in balancer.metrics()["replicas"].values())
            ),
            timeout=120,
        )
        return name, moved_to, again, moves, survivor

    name, moved_to, again, moves, survivor = asyncio.run(run())
    assert moved_to is not None and moved_to != name and len(again.token_ids) >= 1
    assert moves >= 1 and len(survivor.token_ids) >= 1
