"""The preflight checks every HTTP-server engine runs: one GPU set per launched replica,
GPUs with memory free for a launch, and the model cards an attached server answers with.
Each engine plugin's own preflight calls these beside its specific checks."""

from __future__ import annotations

from typing import Any

import httpx

from slr.preflight import CheckResult, fatal
from slr.preflight.gpus import gpu_headroom

DOC = "docs/troubleshooting/startup.md#engine-unreachable"
HEALTH_TIMEOUT_S = 10.0


def replica_gpus(options: Any) -> CheckResult | None:
    """A fatal result when ``gpus_per_replica`` does not list one GPU set per replica."""
    o = options
    if o.urls or not o.gpus_per_replica or len(o.gpus_per_replica) == o.replicas:
        return None
    return fatal(
        f"engine.replicas = {o.replicas} but engine.gpus_per_replica lists "
        f"{len(o.gpus_per_replica)} GPU set(s) ({o.gpus_per_replica})",
        fix="give one CUDA_VISIBLE_DEVICES value per replica, or set replicas to match",
    )


def launch_headroom(options: Any, *, label: str) -> CheckResult:
    """Whether this machine has the GPUs (with memory free) the launched servers ask for."""
    o = options
    per = [len(g.split(",")) for g in o.gpus_per_replica] or [1] * o.replicas
    return gpu_headroom(
        f"{o.replicas} {label} server(s) to launch",
        sum(per),
        fix="launch the servers on a GPU machine and attach with engine.urls, or use "
        "--engine hf on a CPU",
    )


def model_cards(url: str) -> list[dict[str, Any]]:
    """The model cards a server's ``/v1/models`` lists; raises ``httpx.HTTPError`` or
    ``ValueError`` when it does not answer with them."""
    response = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=HEALTH_TIMEOUT_S)
    response.raise_for_status()
    return list(response.json().get("data", []))
