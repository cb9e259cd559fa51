"""mini-swe-agent model classes that call the session's OpenAI endpoint with ``requests``.

This file runs inside the sandbox, on the bundle's interpreter, loaded by mini through its
own ``model.model_class`` setting (a full import path); it is not imported by slr.

Why: mini's default classes call the model through litellm, and importing litellm costs
about 5 CPU-seconds per trial (3,000 modules) before the first model call; the trial pays
it for every rollout. mini also ships OpenRouter classes that speak the same Chat
Completions wire format with plain ``requests``, but with OpenRouter's URL built in. These
subclasses only point them at the endpoint mini is given (``model.api_base``,
``model.api_key``) and let the request wait as long as the trial allows
(``model.timeout_s``: a long prefill on a loaded CPU must not turn into a retry, which
would generate the same turn twice). Everything else (message preparation, retries, action
parsing, observation templates, the trajectory) is mini's own code.
"""

import json
from typing import Any, ClassVar

import requests  # pyright: ignore[reportMissingModuleSource]

# mini lives in the bundle's interpreter, where this runs, not in the dev venv.
from minisweagent.models.openrouter_model import (  # pyright: ignore[reportMissingImports]
    OpenRouterAPIError,
    OpenRouterAuthenticationError,
    OpenRouterModel,
    OpenRouterRateLimitError,
)
from minisweagent.models.openrouter_textbased_model import (  # pyright: ignore[reportMissingImports]
    OpenRouterTextbasedModel,
)
from minisweagent.models.utils.actions_toolcall import BASH_TOOL  # pyright: ignore[reportMissingImports]

# Statuses no retry can change: bad request (context overflow), forbidden, not found, too large.
_REFUSED = frozenset({400, 403, 404, 413, 422})


class EndpointRefused(Exception):
    """The endpoint refused the request for good; mini ends the run instead of retrying."""


class _Endpoint:
    """The request half: where to send it, with which key, how long to wait."""

    config: Any  # mini's model config (pydantic)
    _tools: ClassVar[list[dict[str, Any]]]
    abort_exceptions: ClassVar[list[type[BaseException]]] = [
        *OpenRouterModel.abort_exceptions,
        EndpointRefused,
    ]

    def _point(self, api_base: str, api_key: str, timeout_s: float) -> None:
        self._api_url = api_base.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._timeout_s = timeout_s

    def _query(self, messages, **kwargs):
        payload = {
            "model": self.config.model_name,
            "messages": messages,
            **({"tools": self._tools} if self._tools else {}),
            **(self.config.model_kwargs | kwargs),
        }
        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"}
        try:
            response = requests.post(
                self._api_url, headers=headers, data=json.dumps(payload), timeout=self._timeout_s
            )
        except requests.exceptions.RequestException as e:
            raise OpenRouterAPIError(f"Request failed: {e}") from e
        # mini's retry loop gives up on the abort exceptions and retries the others: as with
        # its litellm classes, a refusal that asking again cannot change (bad key, unknown
        # model, a context overflow or another bad request) ends the run; a rate limit, a
        # server error or a lost connection is retried.
        status = response.status_code
        if status == 401:
            raise OpenRouterAuthenticationError(f"HTTP 401: {response.text}")
        if status == 429:
            raise OpenRouterRateLimitError(f"HTTP 429: {response.text}")
        if status in _REFUSED:
            raise EndpointRefused(f"HTTP {status}: {response.text}")
        if status >= 400:
            raise OpenRouterAPIError(f"HTTP {status}: {response.text}")
        return response.json()


class DirectModel(_Endpoint, OpenRouterModel):
    """mini's tool-call model (``mini.yaml``): one ``bash`` tool."""

    _tools: ClassVar[list[dict[str, Any]]] = [BASH_TOOL]

    def __init__(self, *, api_base: str, api_key: str, timeout_s: float = 3600, **kwargs):
        super().__init__(**kwargs)
        self._point(api_base, api_key, timeout_s)


class DirectTextbasedModel(_Endpoint, OpenRouterTextbasedModel):
    """mini's text-based model (``mini_textbased.yaml``): one fenced bash block per reply."""

    _tools: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *, api_base: str, api_key: str, timeout_s: float = 3600, **kwargs):
        super().__init__(**kwargs)
        self._point(api_base, api_key, timeout_s)
