"""The ``slr`` click group. Sub-commands live in small modules; plugins add their own."""

from __future__ import annotations

import gc
import os
import sys

import click

from slr import __version__, log
from slr.contracts import EngineUnavailable, SandboxError
from slr.errors import SlrError
from slr.plugins import get_plugin_manager
from slr_cli import (
    agent_plugin_cmd,
    check_tasks_cmd,
    config_cmd,
    eval_cmd,
    export_cmd,
    new_cmd,
    plugins_cmd,
    preflight_cmd,
    run_cmd,
    serve_cmd,
    status_cmd,
)
from slr_cli.dashboard.command import dashboard

TROUBLESHOOTING = "docs/troubleshooting/README.md"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slr", message="%(prog)s %(version)s")
def cli() -> None:
    """SWE-Lego-RL: train coding agents with online RL on real software tasks.

    \b
    Start here:
      slr plugins                 what is installed (agents, backends, engines, ...)
      slr config show             the resolved run config, every default spelled out
      slr preflight -c run.toml   check config and machine before a run (slr run does too)
      slr run -c run.toml         train; --agent/--backend/--set override the file
      slr eval -c run.toml -k 4   pass@k of the base model; --checkpoint runs/<id> after
      slr status runs/<id>        where a run stands
      slr dashboard runs/         live web view: curves, outcomes, trajectories
      slr check-tasks TASKS       validate tasks: oracle scores 1, nop scores 0
      slr serve --engine hf       the policy behind the proxy, for any scaffold by hand
      slr export atif RUN -o OUT  trials as Harbor's trajectory format (ATIF)
      slr agent-plugin install    /rl:check, /rl:run, /rl:status, /rl:dashboard in Claude Code
    """


cli.add_command(run_cmd.run)
cli.add_command(eval_cmd.eval_)
cli.add_command(export_cmd.export)
cli.add_command(check_tasks_cmd.check_tasks)
cli.add_command(plugins_cmd.plugins)
cli.add_command(config_cmd.config)
cli.add_command(new_cmd.new)
cli.add_command(status_cmd.status)
cli.add_command(dashboard)
cli.add_command(serve_cmd.serve)
cli.add_command(preflight_cmd.preflight)
cli.add_command(agent_plugin_cmd.agent_plugin)


def main() -> None:
    log.configure(level=os.environ.get("SLR_LOG_LEVEL", "info"))
    try:
        get_plugin_manager().hook.register_commands(cli=cli)
        cli.main(standalone_mode=False)
    except SlrError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)
    except (SandboxError, EngineUnavailable) as exc:
        # A start-up failure of a sandbox backend or an engine (failures inside a trial are
        # recorded as its termination, never raised this far): one line, with its fix.
        click.secho(f"error: {exc} (see {TROUBLESHOOTING})", fg="red", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        # The command is done: spare the interpreter's exit a garbage collection over every
        # object torch, transformers and Ray left behind (over a second of every `slr run`).
        # Exit handlers (atexit: logging, Ray, temporary folders) still run.
        gc.freeze()
