"""The in-process proxy: OpenAI and Anthropic APIs per session, exact token capture.

``Proxy(engine, config)``; ``await proxy.start()``; ``session = proxy.open_session(trial_id)``
(base URLs and token for the agent); ``trajectory = proxy.close_session(session)``. See
docs/proxy.md for endpoints, capture semantics and what is accepted and ignored.
"""

from slr.proxy.errors import ApiError
from slr.proxy.server import Proxy, ProxySessions, ProxyThread, Session
from slr.proxy.toolparse import ToolParser, get_tool_parser, tool_parser_names

__all__ = [
    "ApiError",
    "Proxy",
    "ProxySessions",
    "ProxyThread",
    "Session",
    "ToolParser",
    "get_tool_parser",
    "tool_parser_names",
]
