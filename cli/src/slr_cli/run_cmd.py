"""``slr run``: train a policy (or resume a run)."""

from __future__ import annotations

from pathlib import Path

import click

from slr.errors import SlrError, UsageError
from slr_cli.options import config_options, harbor_options, harbor_sets, resolve_config


@click.command()
@config_options
@harbor_options
@click.option(
    "--resume",
    type=click.Path(file_okay=False, path_type=Path),
    help="Continue the run in this run directory (runs/<run-id>) where it stopped.",
)
def run(config_path, agent, backend, engine, optimizer, verifier, sets, resume, **harbor) -> None:
    """Train a coding agent with online RL.

    \b
    Examples:
      slr run -c examples/quickstart/slr.toml
      slr run --agent opencode --backend docker --set rollout.n_per_task=8
      slr run --resume runs/quickstart-20261130-101500
      slr run -a opencode -e docker -m Qwen/Qwen2.5-Coder-0.5B-Instruct -p TASKS -n 8

    \b
    Harbor's options mean what they mean in `harbor run`: -a agent, -e environment
    (backend), -m model ([engine] model), -p task path, -n concurrent trials,
    --timeout-multiplier / --agent-timeout-multiplier / --verifier-timeout-multiplier.

    The config is resolved and validated first (see `slr config show`); an unknown plugin or
    key stops the run before anything starts.
    """
    if resume is not None:
        chosen = (agent, backend, engine, optimizer, verifier, *harbor.values())
        if config_path or sets or any(v is not None for v in chosen):
            raise UsageError(
                "--resume continues a run with the config saved in its run directory; "
                "drop -c/--set/--agent/-m/... (edit RUN/config.toml to change it)"
            )
        cfg = None
    else:
        sets = [*sets, *harbor_sets(**harbor)]
        cfg = resolve_config(config_path, agent, backend, engine, optimizer, verifier, sets)
    try:
        from slr.training import train  # the sync or async loop, as run.mode says
    except ImportError:
        raise SlrError(
            "this build of slr-core has no training loop yet (slr.training); the config above "
            "is valid. Use `slr config show` to inspect it."
        ) from None
    train(cfg, resume=resume)
