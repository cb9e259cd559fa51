"""SWE-Lego-RL: online RL for coding agents in their native harnesses.

``__all__`` is the API a plugin author starts from: ``hookimpl``, the contracts a plugin
implements and the records they pass, the errors, ``option`` for a plugin's config section.
Every name here is also importable from the module that owns it; the public modules and the
rule for using them are in ``docs/api.md`` (``slr._api`` is their one list).

The re-exports are loaded on first use: every plugin imports ``slr`` (for ``hookimpl``) in
every process, and the contracts pull in attrs, the config and its Ray address check.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from slr.hookspecs import hookimpl

if TYPE_CHECKING:
    from slr.config import option
    from slr.contracts import (
        AgentAdapter,
        AgentOutcome,
        BrokenEnvironment,
        Bundle,
        ClosableOptimizer,
        ClosableStream,
        ContextOverflow,
        Endpoint,
        Engine,
        EngineUnavailable,
        ExecResult,
        ForcedDecoding,
        Generation,
        GenerationChunk,
        HealthChecked,
        MeteredSandbox,
        NetworkMode,
        Optimizer,
        Prestarting,
        Reward,
        RoutedExperts,
        SamplingParams,
        Sandbox,
        SandboxBackend,
        SandboxError,
        Segment,
        SessionPinning,
        StatsReporting,
        TerminationReason,
        Trajectory,
        TrialCosts,
        TrialResult,
        UpdateMode,
        Verifier,
        VerifierError,
        VerifierTimeout,
    )
    from slr.contracts.weights import LoraSpec, WeightUpdate
    from slr.errors import ConfigError, PluginError, SlrError, UsageError
    from slr.metrics.loggers import MetricLogger
    from slr.preflight import CheckResult
    from slr.tasks import Task

try:
    __version__ = version("slr-core")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

#: re-exported name -> the module that owns it
_EXPORTS = {
    "option": "slr.config",
    **dict.fromkeys(
        (
            "AgentAdapter",
            "AgentOutcome",
            "BrokenEnvironment",
            "Bundle",
            "ClosableOptimizer",
            "ClosableStream",
            "ContextOverflow",
            "Endpoint",
            "Engine",
            "EngineUnavailable",
            "ExecResult",
            "ForcedDecoding",
            "Generation",
            "GenerationChunk",
            "HealthChecked",
            "MeteredSandbox",
            "NetworkMode",
            "Optimizer",
            "Prestarting",
            "Reward",
            "RoutedExperts",
            "SamplingParams",
            "Sandbox",
            "SandboxBackend",
            "SandboxError",
            "Segment",
            "SessionPinning",
            "StatsReporting",
            "TerminationReason",
            "Trajectory",
            "TrialCosts",
            "TrialResult",
            "UpdateMode",
            "Verifier",
            "VerifierError",
            "VerifierTimeout",
        ),
        "slr.contracts",
    ),
    "LoraSpec": "slr.contracts.weights",
    "WeightUpdate": "slr.contracts.weights",
    "ConfigError": "slr.errors",
    "PluginError": "slr.errors",
    "SlrError": "slr.errors",
    "UsageError": "slr.errors",
    "MetricLogger": "slr.metrics.loggers",
    "CheckResult": "slr.preflight",
    "Task": "slr.tasks",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'slr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "AgentAdapter",
    "AgentOutcome",
    "BrokenEnvironment",
    "Bundle",
    "CheckResult",
    "ClosableOptimizer",
    "ClosableStream",
    "ConfigError",
    "ContextOverflow",
    "Endpoint",
    "Engine",
    "EngineUnavailable",
    "ExecResult",
    "ForcedDecoding",
    "Generation",
    "GenerationChunk",
    "HealthChecked",
    "LoraSpec",
    "MeteredSandbox",
    "MetricLogger",
    "NetworkMode",
    "Optimizer",
    "PluginError",
    "Prestarting",
    "Reward",
    "RoutedExperts",
    "SamplingParams",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "Segment",
    "SessionPinning",
    "SlrError",
    "StatsReporting",
    "Task",
    "TerminationReason",
    "Trajectory",
    "TrialCosts",
    "TrialResult",
    "UpdateMode",
    "UsageError",
    "Verifier",
    "VerifierError",
    "VerifierTimeout",
    "WeightUpdate",
    "__version__",
    "hookimpl",
    "option",
]
