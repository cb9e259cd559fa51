"""Helpers shared by sandbox backends: the proxy link (host relay, in-sandbox relay), the
command-to-argv rule, process bookkeeping."""

from slr.sandboxing.commands import command_argv
from slr.sandboxing.host_relay import HostRelay
from slr.sandboxing.proxy_link import (
    RELAY_SCRIPT,
    ProxyLink,
    inner_proxy_url,
    pid_alive,
    remove_stale_links,
)

__all__ = [
    "RELAY_SCRIPT",
    "HostRelay",
    "ProxyLink",
    "command_argv",
    "inner_proxy_url",
    "pid_alive",
    "remove_stale_links",
]
