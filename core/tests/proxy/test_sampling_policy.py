"""In training the proxy samples at [rollout]'s temperature, whatever the agent asks for."""

from __future__ import annotations

import openai
import pytest

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread


class SamplingSpy:
    """The real engine, noting the sampling parameters of each call."""

    def __init__(self, engine) -> None:
        self.engine, self.seen = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        self.seen.append(sampling)
        return await self.engine.generate(prompt_ids, sampling, session_id=session_id)

    def stream(self, prompt_ids, sampling, *, session_id=None):
        self.seen.append(sampling)
        return self.engine.stream(prompt_ids, sampling, session_id=session_id)


@pytest.mark.parametrize(("policy", "expected"), [("ignore", (0.7, 0.9)), ("honor", (0.2, 0.5))])
def test_client_sampling_policy(tiny_engine, policy, expected):
    spy = SamplingSpy(tiny_engine.engine)
    proxy = Proxy(
        spy,
        ProxySection(client_sampling=policy),
        sampling=SamplingParams(temperature=0.7, top_p=0.9, max_tokens=4),
    )
    with ProxyThread(proxy):
        session = proxy.open_session(f"sampling-{policy}")
        client = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
        client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "Hi"}],
            temperature=0.2,
            top_p=0.5,
        )
        proxy.close_session(session)
    assert [(s.temperature, s.top_p) for s in spy.seen] == [expected]
