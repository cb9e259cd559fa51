"""Helpers shared by sandbox backends: the proxy link and process-tree bookkeeping."""

from slr.sandboxing.proxy_link import (
    RELAY_SCRIPT,
    ProxyLink,
    inner_proxy_url,
    pid_alive,
    remove_stale_links,
)

__all__ = ["RELAY_SCRIPT", "ProxyLink", "inner_proxy_url", "pid_alive", "remove_stale_links"]
