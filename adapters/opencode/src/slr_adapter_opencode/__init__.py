"""slr-adapter-opencode: registers the ``opencode`` agent adapter with slr."""

from slr import hookimpl


@hookimpl
def register_agents(register):
    from slr_adapter_opencode.adapter import OpenCodeConfig

    register("opencode", "slr_adapter_opencode.adapter:OpenCode", config_cls=OpenCodeConfig)


@hookimpl
def register_commands(cli):
    from slr.agents.bundles_cli import add_bundles_command

    add_bundles_command(cli)


def check_bundle(ctx):
    """The opencode bundle is built and its binary runs on this machine."""
    if not ctx.uses("agent", "opencode"):
        return None
    from slr.preflight.bundles import bundle_runs

    version = ctx.options("agent").version
    return bundle_runs("opencode", version, ["node_modules/.bin/opencode", "--version"])


@hookimpl
def register_preflight_checks(register):
    register("opencode-bundle", check_bundle, stage="data")
