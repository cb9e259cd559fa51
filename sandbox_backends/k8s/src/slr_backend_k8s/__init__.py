"""slr-backend-k8s: one Kubernetes pod per trial, through the official ``kubernetes`` client."""

from __future__ import annotations

import slr
from slr_backend_k8s.config import K8sBackendConfig

__all__ = ["K8sBackendConfig"]


@slr.hookimpl
def register_sandbox_backends(register):
    register("k8s", "slr_backend_k8s.backend:K8sBackend", config_cls=K8sBackendConfig)


@slr.hookimpl
def register_preflight_checks(register):
    from slr_backend_k8s import preflight

    register("k8s-config", preflight.check_config, stage="config")
    register("k8s-api", preflight.check_api, stage="machine")
    register("k8s-images", preflight.check_images, stage="machine")
    register("k8s-pids", preflight.check_pids, stage="machine")
