"""``slr run``: train a policy (or resume a run)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slr.config import load_config
from slr.config.cli import config_options, harbor_options, harbor_sets, resolve_config
from slr.errors import UsageError
from slr.plugins import get_plugin_manager
from slr.preflight.gate import gate, skip_preflight_option
from slr.run.directory import RunDir


@click.command()
@config_options
@harbor_options
@click.option(
    "--resume",
    type=click.Path(file_okay=False, path_type=Path),
    help="Continue the run in this run directory (runs/<run-id>) where it stopped.",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    help="Record the run in exactly this (new) folder instead of RUNS_DIR/<name>-<time>.",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="Run on this Ray cluster: auto (joined with `ray start`), host:port, "
    "ray://host:port, or local. Same as --set run.ray_address=ADDR.",
)
@skip_preflight_option
def run(
    config_path,
    agent,
    backend,
    engine,
    optimizer,
    verifier,
    sets,
    resume,
    output,
    ray_address,
    skip_preflight,
    **harbor,
) -> None:
    """Train a coding agent with online RL.

    \b
    Examples:
      slr run -c examples/quickstart/slr.toml
      slr run --agent opencode --backend docker --set rollout.n_per_task=8
      slr run --resume runs/quickstart-20261130-101500
      nohup slr run -c run.toml --output runs/mine > runs/mine.log 2>&1 &
      slr run --ray-address auto --set run.engine_replicas=4 --set run.engine_resources.GPU=1
      slr run -a opencode -e docker -m Qwen/Qwen2.5-Coder-0.5B-Instruct -p TASKS -n 8

    \b
    Harbor's options mean what they mean in `harbor run`: -a agent, -e environment
    (backend), -m model ([engine] model), -p task path, -n concurrent trials,
    --timeout-multiplier / --agent-timeout-multiplier / --verifier-timeout-multiplier.

    The config is resolved and validated first (see `slr config show`); an unknown plugin or
    key stops the run before anything starts, and so does a fatal preflight check (see
    `slr preflight`).
    """
    if ray_address is not None:
        sets = (*sets, f"run.ray_address={json.dumps(ray_address)}")
    if resume is not None:
        chosen = (agent, backend, engine, optimizer, verifier, output, *harbor.values())
        if config_path or sets or any(v is not None for v in chosen):
            raise UsageError(
                "--resume continues a run with the config saved in its run directory; "
                "drop -c/--set/--agent/-m/... (edit RUN/config.toml to change it)"
            )
        cfg = None
        # the saved config is checked as the resumed run will use it
        saved = RunDir.open(resume).path / RunDir.CONFIG
        checked = load_config(saved, plugins=get_plugin_manager())
    else:
        sets = [*sets, *harbor_sets(**harbor)]
        cfg = checked = resolve_config(
            config_path, agent, backend, engine, optimizer, verifier, sets
        )
    if output is not None:
        RunDir.check_new(output)  # before the preflight: a taken folder is refused at once
    gate(checked, purpose="run", skip=skip_preflight)
    from slr.run.training import train  # the sync or async loop, as run.mode says

    train(cfg, resume=resume, output=output)
