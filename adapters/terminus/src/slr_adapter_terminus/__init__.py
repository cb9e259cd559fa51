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
