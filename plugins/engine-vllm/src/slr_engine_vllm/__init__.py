"""slr-engine-vllm: vLLM servers as inference engines (plugin ``vllm``).

Launches ``vllm serve`` processes (or attaches to running servers) and speaks vLLM's
OpenAI-compatible completions API with prompt token ids in and sampled token ids plus
log-probs out. Several servers are combined behind ``slr.engines.balancer.LoadBalancer``.
"""

import slr
from slr_engine_vllm.config import VllmEngineConfig

__all__ = ["VllmEngineConfig"]


@slr.hookimpl
def register_engines(register):
    register("vllm", "slr_engine_vllm.engine:create_engine", config_cls=VllmEngineConfig)


@slr.hookimpl
def register_preflight_checks(register):
    from slr_engine_vllm.preflight import check_config, check_servers

    register("vllm-config", check_config, stage="config")
    register("vllm-servers", check_servers, stage="machine")
