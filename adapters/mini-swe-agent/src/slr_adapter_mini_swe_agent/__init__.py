"""slr-adapter-mini-swe-agent: registers the ``mini-swe-agent`` agent adapter with slr."""

from slr import hookimpl


@hookimpl
def register_agents(register):
    from slr_adapter_mini_swe_agent.adapter import MiniSweAgentConfig

    register(
        "mini-swe-agent",
        "slr_adapter_mini_swe_agent.adapter:MiniSweAgent",
        config_cls=MiniSweAgentConfig,
    )


@hookimpl
def register_commands(cli):
    from slr.agents.bundles_cli import add_bundles_command

    add_bundles_command(cli)


def check_bundle(ctx):
    """The mini-swe-agent bundle is built and its interpreter runs and has mini-swe-agent at the configured version."""
    if not ctx.uses("agent", "mini-swe-agent"):
        return None
    from slr.agents.bundle_recipes import python_bundle_version, python_env
    from slr.preflight.bundles import VERSION_PROBE, bundle_runs

    c = ctx.options("agent")
    command = [f"python/bin/python{c.python}", "-c", VERSION_PROBE, "mini-swe-agent", c.version]
    return bundle_runs(
        "mini-swe-agent", python_bundle_version(c.version, c.python), command, env=python_env
    )


@hookimpl
def register_preflight_checks(register):
    register("mini-swe-agent-bundle", check_bundle, stage="data")
