"""Registers the tool-call parser the core ships: ``hermes`` (``slr.proxy.toolparse``)."""

from __future__ import annotations

from slr.hookspecs import hookimpl


@hookimpl
def register_tool_parsers(register):
    register("hermes", "slr.proxy.toolparse:HermesParser")
