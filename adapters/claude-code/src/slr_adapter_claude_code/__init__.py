"""slr-adapter-claude-code: registers the ``claude-code`` agent adapter with slr."""

from slr import hookimpl


@hookimpl
def register_agents(register):
    from slr_adapter_claude_code.adapter import ClaudeCodeConfig

    register(
        "claude-code", "slr_adapter_claude_code.adapter:ClaudeCode", config_cls=ClaudeCodeConfig
    )


@hookimpl
def register_commands(cli):
    from slr.agents.bundles_cli import add_bundles_command

    add_bundles_command(cli)
