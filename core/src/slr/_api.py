"""The border of the public API: which core modules a plugin may import, and which names.

Plugins (every distribution but the core and the CLI) import the core only through what is
listed here: ``slr``'s ``__all__`` and the modules below. Everything else in ``slr`` is
internal and may change without notice; a plugin that needs an internal name asks for it to
be made public (listed here and in ``docs/api.md``) rather than importing it.
``tests/test_layering.py`` enforces the list, and checks that ``docs/api.md`` shows the same
modules. The CLI (``slr_cli``) is the product's front end and may import internals.

The list is data: importing ``slr._api`` loads nothing else.
"""

from __future__ import annotations

#: every name of the module that does not start with an underscore
ALL = "*"
#: the names in the module's own ``__all__``
OWN_ALL = "__all__"

#: module -> its public names (``ALL``: every name without a leading underscore; ``OWN_ALL``:
#: its ``__all__``; else the names listed). A module
#: that lists names is internal apart from them: a plugin imports those names from it
#: (``from slr.rollout.trial import new_trial_id``), never the module itself.
PUBLIC_MODULES: dict[str, str | tuple[str, ...]] = {
    # what every plugin imports first: hookimpl, the contracts, the errors (its ``__all__``)
    "slr": OWN_ALL,
    "slr.hookspecs": ALL,
    "slr.errors": ALL,
    "slr.plugins": ("PluginManager", "Registration", "get_plugin_manager", "make_plugin"),
    "slr.tasks": ALL,
    # config: a plugin's section is an attrs class with ``option(doc=...)`` fields
    "slr.config": ALL,
    "slr.config.structure": ALL,
    "slr.config.cli": ALL,
    # the contracts plugins implement and the records they pass
    "slr.contracts": OWN_ALL,
    "slr.contracts.agent": ALL,
    "slr.contracts.engine": ALL,
    "slr.contracts.network": ALL,
    "slr.contracts.optimizer": ALL,
    "slr.contracts.records": ALL,
    "slr.contracts.routing": ALL,
    "slr.contracts.sandbox": ALL,
    "slr.contracts.serialize": ALL,
    "slr.contracts.verifier": ALL,
    "slr.contracts.weights": ALL,
    # preflight checks a plugin registers, and the helpers its checks share
    "slr.preflight": ALL,
    "slr.preflight.gate": ALL,
    "slr.preflight.bundles": ALL,
    "slr.preflight.engines": ALL,
    "slr.preflight.gpus": ALL,
    "slr.preflight.model": ALL,
    # the agent toolkit (adapters)
    "slr.agents": ALL,
    "slr.agents.bundles": ALL,
    "slr.agents.bundle_recipes": ALL,
    "slr.agents.bundles_cli": ALL,
    "slr.agents.headless": ALL,
    "slr.agents.prestart": ALL,
    "slr.agents.prestart_main": ALL,
    "slr.agents.tmux": ALL,
    # what sandbox backends share
    "slr.sandboxing": ALL,
    "slr.sandboxing.cpu": ALL,
    "slr.sandboxing.exec_channel": ALL,
    "slr.sandboxing.exec_server": ALL,
    "slr.sandboxing.labels": ALL,
    "slr.sandboxing.relay": ALL,
    # what engines share (HTTP-server engines, LoRA adapter folders, the balancer)
    "slr.engines": ALL,
    "slr.engines.balancer": ALL,
    "slr.engines.lora": ALL,
    "slr.engines.options": ALL,
    "slr.engines.protocol": ALL,
    "slr.engines.remote": ALL,
    "slr.engines.server": ALL,
    # tool-call parsers (register_tool_parsers) and the chat template's turn end
    "slr.proxy.messages": ALL,
    "slr.proxy.toolparse": ALL,
    "slr.proxy.render": ("turn_suffix",),
    # metric loggers (register_loggers)
    "slr.metrics.loggers": ALL,
    # the run directory and the checkpoint layout (optimizers write checkpoints into it)
    "slr.run.directory": ALL,
    "slr.run.checkpoints": ALL,
    # commands that run trials without training (slr infer, slr data validate)
    "slr.run.evaluation": ("Evaluation", "engine_model"),
    "slr.rollout.recorder": ("TrialSpec",),
    "slr.rollout.trial": ("new_trial_id",),
    "slr.rollout.task_check": ALL,
    # the run's Ray, for plugins that start actors of their own
    "slr.cluster.ray_runtime": ALL,
}

#: the test kit: for plugins' tests, never imported by product code (anything under src/)
TEST_KIT = ("slr_testkit",)
