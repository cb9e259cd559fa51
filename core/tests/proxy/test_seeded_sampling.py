"""A seeded run samples the same tokens for a trial whatever shares the engine's batch.

The proxy derives each call's seed from the run's seed, the trial id and the call number
(``call_seed``); the hf engine gives every request its own generator. So a trial alone and
the same trial among five others sampling at once get the same reply, and two trials of one
group (or two calls of one trial) get different draws.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread
from slr.proxy.session import call_seed

pytestmark = pytest.mark.timeout(300)

PROMPT = [{"role": "user", "content": "Write a short poem about the sea."}]


def test_call_seed_is_a_pure_function_of_run_trial_and_call():
    assert call_seed(None, "t", 0) is None
    assert call_seed(0, "s00001-00-task-0", 0) == call_seed(0, "s00001-00-task-0", 0)
    seeds = {
        call_seed(base, trial, call)
        for base in (0, 1)
        for trial in ("s00001-00-task-0", "s00001-00-task-1")
        for call in (0, 1)
    }
    assert len(seeds) == 8
    assert all(0 <= s < 2**63 for s in seeds)


def _proxy(engine, seed: int | None) -> Proxy:
    return Proxy(
        engine,
        ProxySection(model_names=["policy"]),
        sampling=SamplingParams(temperature=1.0, max_tokens=16, seed=seed),
    )


async def _replies(proxy: Proxy, trial_ids: list[str]) -> dict[str, str]:
    """One call per trial, all sent at once; each trial's reply text."""

    async def one(trial_id: str) -> tuple[str, str]:
        session = proxy.open_session(trial_id)
        try:
            async with openai.AsyncOpenAI(
                base_url=session.openai_base_url, api_key="k", max_retries=0
            ) as client:
                out = await client.chat.completions.create(model="policy", messages=PROMPT)
            return trial_id, out.choices[0].message.content or ""
        finally:
            proxy.close_session(session)

    return dict(await asyncio.gather(*(one(t) for t in trial_ids)))


def test_a_trial_samples_the_same_reply_alone_and_in_a_crowd(tiny_engine):
    proxy = _proxy(tiny_engine, seed=7)
    group = [f"s00001-00-poem-{k}" for k in range(6)]
    with ProxyThread(proxy):
        alone = asyncio.run(_replies(proxy, group[:1]))
        crowd = asyncio.run(_replies(proxy, group))
        again = asyncio.run(_replies(proxy, list(reversed(group))))
    assert alone[group[0]] == crowd[group[0]]
    assert crowd == again
    # the trials of one group draw differently: otherwise GRPO would see no variance
    assert len(set(crowd.values())) > 1, crowd


def test_without_a_seed_calls_draw_fresh_entropy(tiny_engine):
    proxy = _proxy(tiny_engine, seed=None)
    with ProxyThread(proxy):
        first = asyncio.run(_replies(proxy, ["poem-0"]))
        second = asyncio.run(_replies(proxy, ["poem-0"]))
        third = asyncio.run(_replies(proxy, ["poem-0"]))
    assert len({first["poem-0"], second["poem-0"], third["poem-0"]}) > 1
