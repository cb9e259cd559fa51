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
