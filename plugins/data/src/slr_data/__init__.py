"""slr-data: ``slr data`` (import, mine, synth, validate, filter, index, stats) and ``slr infer``."""

from __future__ import annotations

import slr


@slr.hookimpl
def register_commands(cli):
    from slr_data.commands import data

    cli.add_command(data)
