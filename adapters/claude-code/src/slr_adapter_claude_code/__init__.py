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


def check_bundle(ctx):
    """The claude-code bundle is built and its binary runs on this machine."""
    if not ctx.uses("agent", "claude-code"):
        return None
    from slr.preflight.bundles import bundle_runs

    version = ctx.options("agent").version
    return bundle_runs("claude-code", version, ["node_modules/.bin/claude", "--version"])


@hookimpl
def register_preflight_checks(register):
    register("claude-code-bundle", check_bundle, stage="data")
