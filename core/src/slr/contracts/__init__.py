"""Contracts: the protocols each plugin implements and the records they pass."""

from slr.contracts.agent import BUNDLE_MOUNT, AgentAdapter, AgentOutcome, Bundle, Endpoint
from slr.contracts.engine import (
    UPDATE_MODES,
    ContextOverflow,
    Engine,
    EngineUnavailable,
    ForcedDecoding,
    SessionPinning,
    UpdateMode,
    collect,
)
from slr.contracts.network import NETWORK_MODES, NetworkMode, network_mode
from slr.contracts.optimizer import Optimizer
from slr.contracts.records import (
    ExecResult,
    Generation,
    GenerationChunk,
    Reward,
    SamplingParams,
    Segment,
    TerminationReason,
    Trajectory,
    TrialCosts,
    TrialResult,
)
from slr.contracts.routing import RoutedExperts
from slr.contracts.sandbox import (
    BrokenEnvironment,
    HealthChecked,
    MeteredSandbox,
    Sandbox,
    SandboxBackend,
    SandboxError,
)
from slr.contracts.serialize import from_dict, to_dict
from slr.contracts.verifier import Verifier, VerifierError, VerifierTimeout

__all__ = [
    "BUNDLE_MOUNT",
    "NETWORK_MODES",
    "UPDATE_MODES",
    "AgentAdapter",
    "AgentOutcome",
    "BrokenEnvironment",
    "Bundle",
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
    "Reward",
    "RoutedExperts",
    "SamplingParams",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "Segment",
    "SessionPinning",
    "TerminationReason",
    "Trajectory",
    "TrialCosts",
    "TrialResult",
    "UpdateMode",
    "Verifier",
    "VerifierError",
    "VerifierTimeout",
    "collect",
    "from_dict",
    "network_mode",
    "to_dict",
]
