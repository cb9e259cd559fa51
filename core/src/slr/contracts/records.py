"""The records that cross plugin boundaries. Frozen attrs classes, validated at construction."""

from __future__ import annotations

import enum
from typing import Any, Literal

import attrs
from attrs import field, frozen, validators

from slr.contracts.routing import RoutedExperts, as_routed_experts, from_json

FinishReason = Literal["stop", "length", "abort"]
BranchKind = Literal["fork", "rewrite"]


class TerminationReason(enum.StrEnum):
    """Why a trial ended. Infrastructure failures are excluded from the loss, never scored 0."""

    COMPLETED = "completed"
    AGENT_TIMEOUT = "agent_timeout"
    AGENT_ERROR = "agent_error"
    CONTEXT_OVERFLOW = "context_overflow"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_ERROR = "verifier_error"
    SANDBOX_ERROR = "sandbox_error"
    ENGINE_ERROR = "engine_error"
    BROKEN_TASK = "broken_task"
    WORKER_LOST = "worker_lost"  # the rollout worker running it died; the trial is re-run

    @property
    def is_infrastructure_failure(self) -> bool:
        """True when the policy is not to blame: the trial must not enter the loss."""
        return self in _INFRA


_INFRA = frozenset(
    {
        TerminationReason.VERIFIER_ERROR,
        TerminationReason.SANDBOX_ERROR,
        TerminationReason.ENGINE_ERROR,
        TerminationReason.BROKEN_TASK,
        TerminationReason.WORKER_LOST,
    }
)


def _same_length_as(other: str):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        ref = getattr(instance, other)
        if value is not None and len(value) != len(ref):
            raise ValueError(
                f"{type(instance).__name__}.{attribute.name} has {len(value)} entries but "
                f"{other} has {len(ref)}; they must align one per token"
            )

    return check


#: Temperatures below this are greedy (read as 0), as vLLM's sampler treats them: dividing the
#: logits by one (a denormal ``4.5e-45`` included) overflows to inf and the sample to NaN.
GREEDY_BELOW = 1e-5


def _temperature(value: float) -> float:
    return 0.0 if 0.0 <= value < GREEDY_BELOW else value


@frozen(kw_only=True)
class SamplingParams:
    """How to sample. ``top_k = 0`` and ``top_p = 1.0`` mean no truncation; a temperature
    below ``GREEDY_BELOW`` is greedy and reads as 0."""

    temperature: float = field(default=1.0, converter=_temperature, validator=validators.ge(0.0))
    top_p: float = field(default=1.0, validator=[validators.gt(0.0), validators.le(1.0)])
    top_k: int = field(default=0, validator=validators.ge(0))
    max_tokens: int = field(default=512, validator=validators.ge(1))
    stop: tuple[str, ...] = field(default=(), converter=tuple)
    stop_token_ids: tuple[int, ...] = field(default=(), converter=tuple)
    seed: int | None = None


def _versions_default(self: Any) -> tuple[int, ...]:
    return (self.weights_version,) * len(self.token_ids)


@frozen(kw_only=True)
class Generation:
    """What an engine generated for one call.

    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it was
    sampled from *after* temperature scaling and before top-k / top-p truncation (see the
    engine docs); the trainer scores tokens under the same definition.
    ``weights_versions[i]`` is the version of the weights that sampled ``token_ids[i]``: a
    generation interrupted by a partial weight update spans two versions. It defaults to
    ``weights_version`` (the version that ran the prompt) for every token.
    """

    token_ids: tuple[int, ...] = field(converter=tuple)
    logprobs: tuple[float, ...] = field(converter=tuple, validator=_same_length_as("token_ids"))
    finish_reason: FinishReason
    routed_experts: RoutedExperts | None = field(default=None, converter=as_routed_experts)
    weights_version: int = 0
    prompt_tokens: int = 0
    weights_versions: tuple[int, ...] = field(
        default=attrs.Factory(_versions_default, takes_self=True),
        converter=tuple,
        validator=_same_length_as("token_ids"),
    )


@frozen(kw_only=True)
class GenerationChunk:
    """A piece of a streamed generation: the tokens sampled since the previous chunk.

    ``token_ids``, ``logprobs`` and ``weights_versions`` align one per token (any may be
    empty). ``routed_experts`` holds the routing entries of the tokens the model ran for
    this chunk (the first chunk carries the prompt's), or ``None`` when not captured.
    ``finish_reason`` is ``None`` on every chunk but the last one of a stream.
    """

    token_ids: tuple[int, ...] = field(default=(), converter=tuple)
    logprobs: tuple[float, ...] = field(
        default=(), converter=tuple, validator=_same_length_as("token_ids")
    )
    weights_versions: tuple[int, ...] = field(
        default=(), converter=tuple, validator=_same_length_as("token_ids")
    )
    routed_experts: RoutedExperts | None = field(default=None, converter=as_routed_experts)
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


@frozen(kw_only=True)
class ExecResult:
    """One command run in a sandbox."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@frozen(kw_only=True)
class Segment:
    """A contiguous token sequence the policy saw: prompt tokens (mask 0) and its own (mask 1).

    ``logprobs`` holds the behaviour log-prob for mask-1 tokens and 0.0 elsewhere.
    ``routed_experts`` (MoE models, with the engine's routing capture on) holds the experts
    of each token from the first, in order, as the pass that first ran it routed it; it
    may end before the tokens do (the last generated token is never run), and is None when
    any call of the segment came back without routing.
    """

    token_ids: tuple[int, ...] = field(converter=tuple)
    loss_mask: tuple[int, ...] = field(converter=tuple, validator=_same_length_as("token_ids"))
    logprobs: tuple[float, ...] = field(converter=tuple, validator=_same_length_as("token_ids"))
    routed_experts: RoutedExperts | None = field(default=None, converter=from_json)
    weights_versions: tuple[int, ...] = field(default=(), converter=tuple)
    # Lineage (absent in records written before it: a root). ``parent`` is the index, in its
    # trajectory, of the earlier segment this one shares the longest token prefix with;
    # ``token_ids[:branch_at]`` equals the parent's. ``branch`` says how the proxy judged it:
    # "fork" (the parent kept being extended: a sub-agent or side conversation) or
    # "rewrite" (the parent was never extended again: compaction, an edited history).
    parent: int | None = field(default=None, validator=validators.optional(validators.ge(0)))
    branch_at: int = field(default=0, validator=validators.ge(0))
    branch: BranchKind | None = None

    def __attrs_post_init__(self) -> None:
        if self.routed_experts is not None and len(self.routed_experts) > len(self.token_ids):
            raise ValueError(
                f"Segment.routed_experts covers {len(self.routed_experts)} tokens but the "
                f"segment has {len(self.token_ids)}; routing is kept per token, from the first"
            )
        if self.parent is None and (self.branch_at or self.branch is not None):
            raise ValueError(
                f"Segment has branch_at={self.branch_at} / branch={self.branch!r} but no "
                "parent; a root segment has branch_at 0 and no branch"
            )
        if self.branch_at > len(self.token_ids):
            raise ValueError(
                f"Segment.branch_at is {self.branch_at} but the segment has only "
                f"{len(self.token_ids)} tokens; it must point inside the segment"
            )

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)


def _parents_come_first(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    for i, seg in enumerate(value):
        if seg.parent is not None and seg.parent >= i:
            raise ValueError(
                f"Trajectory.segments[{i}].parent is {seg.parent}: a segment's parent must be "
                "an earlier segment of the same trajectory"
            )


@frozen(kw_only=True)
class Trajectory:
    """Everything one session generated, as a tree of segments.

    A request that extends no recorded conversation starts a new segment; its ``parent`` is
    the segment it shares the longest token prefix with (see ``Segment``).
    """

    session_id: str
    segments: tuple[Segment, ...] = field(
        default=(), converter=tuple, validator=_parents_come_first
    )
    num_calls: int = 0

    @property
    def num_policy_tokens(self) -> int:
        return sum(s.num_policy_tokens for s in self.segments)

    @property
    def num_branches(self) -> int:
        """Segments that branched off an earlier one (every segment but the roots)."""
        return sum(s.parent is not None for s in self.segments)

    @property
    def num_forks(self) -> int:
        """Branches whose parent stayed live: sub-agents and side conversations."""
        return sum(s.branch == "fork" for s in self.segments)

    @property
    def num_rewrites(self) -> int:
        """Branches that replaced their parent: compactions and edited histories."""
        return sum(s.branch == "rewrite" for s in self.segments)


@frozen(kw_only=True)
class Reward:
    """The verifier's verdict: a scalar for the loss plus whatever else the tests reported."""

    value: float
    details: dict[str, Any] = field(factory=dict)


@frozen(kw_only=True)
class TrialCosts:
    """Where one trial's wall time and sandbox CPU went, phase by phase (``slr.rollout.costs``).

    ``wall_s`` holds every phase of ``slr.rollout.costs.PHASES`` and sums to the trial's
    ``timings["total_s"]``. ``cpu_s`` holds the phases the backend could measure: the CPU of
    everything that ran in the sandbox (and, where the backend can tell, the host work it did
    to make it); a pooled sandbox's ``sandbox_start`` includes what it used while it waited
    in the pool. ``cpu_note`` says what could not be measured. ``pool_start_s`` is the wall
    time the pool spent starting the sandbox ahead of the trial (not in ``wall_s``: it
    overlapped other work); ``None`` when the trial started its own sandbox.
    """

    wall_s: dict[str, float] = field(factory=dict)
    cpu_s: dict[str, float] = field(factory=dict)
    cpu_note: str | None = None
    model_calls: int = 0
    pool_start_s: float | None = None


@frozen(kw_only=True)
class TrialResult:
    """One trial, as recorded in ``runs/<id>/trials/<trial_id>.json``."""

    trial_id: str
    task_id: str
    termination: TerminationReason = field(converter=TerminationReason)
    reward: Reward | None = None
    group_id: str | None = None
    step: int | None = None
    agent: str | None = None
    agent_version: str | None = None
    weights_version: int | None = None
    error: str | None = None
    timings: dict[str, float] = field(factory=dict)
    trajectory: Trajectory | None = None
    logs: dict[str, str] = field(factory=dict)
    costs: TrialCosts | None = None  # absent in records written before cost accounting
    # the agent's change to the working repository, when the trial was run with
    # capture_diff (slr infer); None otherwise
    diff: str | None = None
    # How the agent managed its context, read off the trajectory's segment tree (written to
    # the record for readers; recomputed from the trajectory when a record is built or read):
    # ``compactions`` counts rewrite branches (a compaction, an edited history), ``subagents``
    # fork branches (a sub-agent, a side conversation on the same endpoint).
    compactions: int = field(init=False, default=0)
    subagents: int = field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if self.trajectory is not None:
            object.__setattr__(self, "compactions", self.trajectory.num_rewrites)
            object.__setattr__(self, "subagents", self.trajectory.num_forks)

    @property
    def trainable(self) -> bool:
        """Whether this trial may enter the loss (infrastructure failures may not)."""
        return not self.termination.is_infrastructure_failure and self.reward is not None
