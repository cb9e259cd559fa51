"""slr-adapter-oracle: agents that call no model, for validating tasks and backends.

``oracle`` uploads the task's ``solution/`` and runs ``solve.sh``; ``nop`` does nothing.
A sound task scores 1 with the oracle and 0 with nop (``slr check-tasks``).
"""

from __future__ import annotations

import slr


@slr.hookimpl
def register_agents(register):
    register("oracle", "slr_adapter_oracle.agents:OracleAgent")
    register("nop", "slr_adapter_oracle.agents:NopAgent")


@slr.hookimpl
def register_commands(cli):
    from slr_adapter_oracle.commands import check_tasks

    cli.add_command(check_tasks)
