"""slr-adapter-openhands: registers the ``openhands`` agent adapter with slr."""

from slr import hookimpl


@hookimpl
def register_agents(register):
    from slr_adapter_openhands.adapter import OpenHandsConfig

    register("openhands", "slr_adapter_openhands.adapter:OpenHands", config_cls=OpenHandsConfig)


@hookimpl
def register_commands(cli):
    from slr.agents.bundles_cli import add_bundles_command

    add_bundles_command(cli)


def check_bundle(ctx):
    """The openhands bundle is built and its interpreter runs and has openhands-sdk at the configured version."""
    if not ctx.uses("agent", "openhands"):
        return None
    from slr.agents.bundle_recipes import python_bundle_version, python_env
    from slr.preflight.bundles import VERSION_PROBE, bundle_runs

    c = ctx.options("agent")
    command = [f"python/bin/python{c.python}", "-c", VERSION_PROBE, "openhands-sdk", c.version]
    return bundle_runs(
        "openhands", python_bundle_version(c.version, c.python), command, env=python_env
    )


@hookimpl
def register_preflight_checks(register):
    register("openhands-bundle", check_bundle, stage="data")
