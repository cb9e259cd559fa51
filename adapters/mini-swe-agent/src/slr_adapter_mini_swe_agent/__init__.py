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
