"""slr-engine-sglang: SGLang servers as inference engines (plugin ``sglang``).

Launches ``python -m sglang.launch_server`` processes (or attaches to running servers)
and speaks SGLang's native ``/generate`` API with prompt token ids in and sampled token
ids plus log-probs out. Several servers are combined behind ``slr.engines.balancer.LoadBalancer``.
"""

import slr
from slr_engine_sglang.config import SglangEngineConfig

__all__ = ["SglangEngineConfig"]


@slr.hookimpl
def register_engines(register):
    register("sglang", "slr_engine_sglang.engine:create_engine", config_cls=SglangEngineConfig)


@slr.hookimpl
def register_preflight_checks(register):
    from slr_engine_sglang.preflight import check_config, check_servers

    register("sglang-config", check_config, stage="config")
    register("sglang-servers", check_servers, stage="machine")
