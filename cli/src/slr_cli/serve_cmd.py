"""``slr serve``: the proxy and an engine as a standalone server, for people and batch jobs."""

from __future__ import annotations

import asyncio
import json
import signal

import click

from slr.cluster.engines import build_engine
from slr.config.cli import config_options, resolve_config
from slr.plugins import get_plugin_manager
from slr.proxy.server import is_loopback
from slr.rollout.recorder import TrialRecorder
from slr.run.directory import RunDir
from slr.run.lifecycle import RunLifecycle


@click.command()
@click.argument("model", required=False)
@config_options
@click.option("--port", type=int, default=None, help="Port to listen on (default: [proxy] port).")
@click.option(
    "--host",
    default=None,
    help="Address to listen on (default: [proxy] host, 127.0.0.1). Off loopback every "
    "request, the health check included, needs a session token.",
)
@click.option(
    "--sessions", type=click.IntRange(1), default=1, show_default=True, help="Sessions to open."
)
def serve(
    model, config_path, agent, backend, engine, optimizer, verifier, sets, port, host, sessions
) -> None:
    """Serve the policy through the proxy until interrupted.

    Prints each session's OpenAI and Anthropic base URLs (the session token also works as
    the API key), so you can point any scaffold at the policy by hand, debug an adapter, or
    run batch inference. The agent's own sampling settings are honoured. On Ctrl-C every
    session's trajectory is written to a run directory (trials/<session>.json plus a
    readable trials/<session>/proxy.json).

    \b
    MODEL, as for `vllm serve MODEL`, sets [engine] model: a Hub id (Org/Name, read from
    the local Hub cache: HF_HUB_CACHE or HF_HOME), a model folder or a packaged name.

    \b
    Examples:
      slr serve Qwen/Qwen2.5-Coder-0.5B-Instruct --port 8000
      slr serve --engine hf --set engine.model=path/to/model --port 8000
      OPENAI_BASE_URL=<printed url> OPENAI_API_KEY=<token> my-agent ...
    """
    sets = (
        *sets,
        "proxy.client_sampling=honor",
        *(() if port is None else (f"proxy.port={port}",)),
        *(() if host is None else (f"proxy.host={json.dumps(host)}",)),
        *(() if model is None else (f"engine.model={json.dumps(model)}",)),
    )
    cfg = resolve_config(
        config_path, agent, backend, engine, optimizer, verifier, sets, only_plugins=("engine",)
    )
    asyncio.run(_serve(cfg, sessions))


async def _serve(cfg, n_sessions: int) -> None:
    plugins = get_plugin_manager()
    engine = build_engine(cfg, plugins)  # embedded, or [run] engine_replicas actors
    run = RunDir.create(cfg.run.runs_dir, f"serve-{cfg.run.name}", cfg.to_toml())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    life = RunLifecycle(run, plugins=plugins, config=cfg, kind="serve")
    with life.running(sessions=n_sessions):
        # the trial recorder owns the proxy and closes the engine; each served session is
        # recorded as a trial (no reward: nothing verifies it) through the same path as
        # `slr run` and `slr eval`, so on_trial_finished fires for it too
        async with TrialRecorder(run, plugins=plugins, config=cfg, engine=engine) as session:
            opened = [session.open_session(f"session-{i}") for i in range(n_sessions)]
            assert session.proxy is not None  # an engine was given, so there is a proxy
            names = session.proxy.model_names
            model = names[0] if names else "policy"
            click.echo(f"serving {cfg.engine.name} as model {model!r}; run directory {run.path}")
            for s in opened:
                click.echo(f"session {s.trial_id}: token {s.token}")
                click.echo(f"  openai    {s.openai_base_url}")
                click.echo(f"  anthropic {s.anthropic_base_url}")
            if not is_loopback(session.proxy.host):
                click.echo(
                    f"listening on {session.proxy.host}, reachable from other machines: every "
                    "request needs a session token above (in the URL, or as the API key); "
                    "without one it gets a 401"
                )
            click.echo("Ctrl-C to stop and write the trajectories.", nl=True)
            await stop.wait()
            for s in opened:
                await session.close_session(s)
        life.status = "completed"  # served until told to stop, every trajectory written
    click.echo(f"trajectories written to {run.path / 'trials'}")
