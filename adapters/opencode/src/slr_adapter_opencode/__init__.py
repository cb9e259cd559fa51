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
