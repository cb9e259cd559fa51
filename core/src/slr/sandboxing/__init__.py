"""Helpers shared by sandbox backends: the proxy link and process-tree bookkeeping."""

from slr.sandboxing.proxy_link import RELAY_SCRIPT, ProxyLink, inner_proxy_url

__all__ = ["RELAY_SCRIPT", "ProxyLink", "inner_proxy_url"]
