"""Registers the agents that call no model: ``oracle`` and ``nop`` (``slr.agents.model_free``)."""

from __future__ import annotations

from slr.hookspecs import hookimpl


@hookimpl
def register_agents(register):
    register("oracle", "slr.agents.model_free:OracleAgent")
    register("nop", "slr.agents.model_free:NopAgent")
