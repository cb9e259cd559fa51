"""slr-engine-hf: the embedded transformers engine (plugin ``hf``).

Registers the ``hf`` engine and the ``slr models`` command group. Heavy imports (torch,
transformers) happen only when the engine or a command is used.
"""

import slr
from slr_engine_hf.config import HfEngineConfig

__all__ = ["HfEngineConfig"]


@slr.hookimpl
def register_engines(register):
    register("hf", "slr_engine_hf.engine:HfEngine", config_cls=HfEngineConfig)


@slr.hookimpl
def register_preflight_checks(register):
    from slr_engine_hf.preflight import check_device, check_model

    register("hf-device", check_device, stage="machine")
    register("hf-model", check_model, stage="data")


@slr.hookimpl
def register_commands(cli):
    from slr_engine_hf.cli import models

    cli.add_command(models)
