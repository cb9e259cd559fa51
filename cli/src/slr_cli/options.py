"""Options shared by every command that resolves a run config."""

from __future__ import annotations

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
        click.option("--optimizer", help="Optimizer plugin: torch, verl."),
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
