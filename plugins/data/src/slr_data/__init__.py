"""slr-data: ``slr data`` (import, mine, synth, validate, filter, index, stats) and ``slr infer``."""

from __future__ import annotations

import slr


@slr.hookimpl
def register_commands(cli):
    from slr_data.commands import data
    from slr_data.infer_cmd import infer

    cli.add_command(data)
    cli.add_command(infer)
