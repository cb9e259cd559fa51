"""The click options every command that resolves a run config shares.

``slr run``, ``slr eval``, ``slr preflight`` and plugin commands (``slr infer``,
``slr data filter``) read ``-c/--config``, the plugin choices, ``--set`` and Harbor's run
options the same way; they live in the core so that a plugin's command needs no CLI import.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from slr.config import Config, load_config
from slr.plugins import get_plugin_manager


def config_options(fn):
    """``-c/--config``, the plugin choices and ``--set``, in the order ``--help`` shows them."""
    decorators = [
        click.option(
            "-c",
            "--config",
            "config_path",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Run config (TOML). Without it, the built-in defaults.",
        ),
        click.option(
            "-a", "--agent", help="Agent scaffold plugin, e.g. opencode, claude-code (Harbor's -a)."
        ),
        click.option(
            "-e",
            "--backend",
            help="Sandbox backend plugin: local, docker, k8s (Harbor's -e environment).",
        ),
        click.option("--engine", help="Inference engine plugin: hf, vllm."),
        click.option("--optimizer", help="Optimizer plugin: torch."),
        click.option("--verifier", help="Verifier plugin (default: harbor)."),
        click.option(
            "--set",
            "sets",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override one config value, e.g. --set rollout.n_per_task=8 (repeatable; "
            "the value is read as TOML, else as a string).",
        ),
    ]
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def resolve_config(
    config_path, agent, backend, engine, optimizer, verifier, sets, *, only_plugins=None
) -> Config:
    """The run config ``config_options``' values stand for."""
    return load_config(
        config_path,
        plugins=get_plugin_manager(),
        choose={
            "agent": agent,
            "backend": backend,
            "engine": engine,
            "optimizer": optimizer,
            "verifier": verifier,
        },
        sets=sets,
        only_plugins=only_plugins,
    )


#: Harbor's run options, as ``slr run`` and ``slr eval`` spell them: (dest, decls, kwargs)
_HARBOR_OPTIONS: list[tuple[str, tuple[str, ...], dict]] = [
    (
        "tasks_path",
        ("-p", "--tasks"),
        {
            "type": click.Path(exists=True, path_type=Path),
            "help": "Task folder, folder of tasks or .parquet index (tasks.path; Harbor's -p).",
        },
    ),
    (
        "model",
        ("-m", "--model"),
        {
            "help": "The policy: a Hub id (Org/Name, from the local Hub cache), a model folder "
            "or a packaged name (engine.model; Harbor's -m).",
        },
    ),
    (
        "concurrency",
        ("-n", "-j", "--concurrency"),
        {
            "type": click.IntRange(min=1),
            "help": "Trials at once (rollout.concurrency; Harbor's -n).",
        },
    ),
    (
        "timeout_multiplier",
        ("--timeout-multiplier",),
        {
            "type": click.FloatRange(min=0.0, min_open=True),
            "help": "Scale the agent and verifier timeouts of every task (as Harbor's).",
        },
    ),
    (
        "agent_timeout_multiplier",
        ("--agent-timeout-multiplier",),
        {
            "type": click.FloatRange(min=0.0, min_open=True),
            "help": "Scale every task's agent timeout (rollout.agent_timeout_multiplier); "
            "overrides --timeout-multiplier.",
        },
    ),
    (
        "verifier_timeout_multiplier",
        ("--verifier-timeout-multiplier",),
        {
            "type": click.FloatRange(min=0.0, min_open=True),
            "help": "Scale every task's verifier timeout (verifier.timeout_multiplier); "
            "overrides --timeout-multiplier.",
        },
    ),
]

#: the parameter names ``harbor_options`` adds
HARBOR_OPTION_NAMES = tuple(dest for dest, _, _ in _HARBOR_OPTIONS)


def harbor_options(fn):
    """Harbor's options where they mean what Harbor means: ``-p`` tasks, ``-m`` model,
    ``-n`` concurrency and the timeout multipliers; ``harbor_sets`` turns them into
    ``--set`` overrides."""
    for dest, decls, kwargs in reversed(_HARBOR_OPTIONS):
        fn = click.option(*decls, dest, **kwargs)(fn)
    return fn


def harbor_sets(
    *,
    tasks_path: Path | None = None,
    model: str | None = None,
    concurrency: int | None = None,
    timeout_multiplier: float | None = None,
    agent_timeout_multiplier: float | None = None,
    verifier_timeout_multiplier: float | None = None,
) -> list[str]:
    """The ``--set KEY=VALUE`` overrides that ``harbor_options``' values stand for."""
    sets: list[str] = []
    if tasks_path is not None:
        sets.append(f"tasks.path={json.dumps(str(tasks_path))}")
    if model is not None:
        sets.append(f"engine.model={json.dumps(model)}")
    if concurrency is not None:
        sets.append(f"rollout.concurrency={concurrency}")
    agent = agent_timeout_multiplier or timeout_multiplier
    if agent is not None:
        sets.append(f"rollout.agent_timeout_multiplier={agent!r}")
    verifier = verifier_timeout_multiplier or timeout_multiplier
    if verifier is not None:
        sets.append(f"verifier.timeout_multiplier={verifier!r}")
    return sets
