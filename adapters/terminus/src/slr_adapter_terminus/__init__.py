"""slr-adapter-terminus: registers the ``terminus`` agent adapter (Terminus-2) with slr."""

from slr import hookimpl


@hookimpl
def register_agents(register):
    from slr_adapter_terminus.adapter import TerminusConfig

    register("terminus", "slr_adapter_terminus.adapter:Terminus", config_cls=TerminusConfig)
    # Harbor's name for the same agent.
    register("terminus-2", "slr_adapter_terminus.adapter:Terminus", config_cls=TerminusConfig)


@hookimpl
def register_commands(cli):
    from slr.agents.bundles_cli import add_bundles_command

    add_bundles_command(cli)


def check_bundle(ctx):
    """The terminus bundle is built and its interpreter runs and has harbor at the configured version."""
    if ctx.config.agent.name not in ("terminus", "terminus-2"):
        return None
    from slr.agents.bundle_recipes import python_bundle_version, python_env
    from slr.preflight.bundles import VERSION_PROBE, bundle_runs

    c = ctx.options("agent")
    command = [f"python/bin/python{c.python}", "-c", VERSION_PROBE, "harbor", c.version]
    return bundle_runs(
        "terminus", python_bundle_version(c.version, c.python), command, env=python_env
    )


@hookimpl
def register_preflight_checks(register):
    register("terminus-bundle", check_bundle, stage="data")
