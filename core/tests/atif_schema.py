"""ATIF-v1.7 as pydantic models, written for these tests from the published specification
(Harbor's RFC 0001, "Agent Trajectory Interchange Format", section II: every table's fields,
required or optional, with its types; the rules stated in prose as validators). Unknown
fields are refused at every level, as Harbor's own models refuse them.

The tests also run Harbor's own validator (``harbor.utils.trajectory_validator``) where
Harbor is installed; this module is the check that needs nothing but pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageSource(_Strict):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: str


class ContentPart(_Strict):
    type: Literal["text", "image"]
    text: str | None = None
    source: ImageSource | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ContentPart:
        if (self.type == "text") != (self.text is not None and self.source is None):
            raise ValueError("a text part has text and no source; an image part the reverse")
        return self


class ToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class SubagentTrajectoryRef(_Strict):
    trajectory_id: str | None = None
    trajectory_path: str | None = None
    session_id: str | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resolvable(self) -> SubagentTrajectoryRef:
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent ref sets trajectory_id or trajectory_path")
        return self


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: str | list[ContentPart] | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None
    extra: dict[str, Any] | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> Metrics:
        # "Should align ... Length should match completion_tokens": held to it here
        ids, lps = self.completion_token_ids, self.logprobs
        if ids is not None and lps is not None and len(ids) != len(lps):
            raise ValueError("completion_token_ids and logprobs differ in length")
        for seq in (ids, lps):
            if seq is not None and self.completion_tokens is not None:
                if len(seq) != self.completion_tokens:
                    raise ValueError("token ids / logprobs do not match completion_tokens")
        return self


class Step(_Strict):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str | list[ContentPart]
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    extra: dict[str, Any] | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    is_copied_context: bool | None = None

    @model_validator(mode="after")
    def _agent_only(self) -> Step:
        if self.source != "agent":
            for name in ("model_name", "reasoning_effort", "reasoning_content", "tool_calls"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only for agent steps")
            if self.metrics is not None:
                raise ValueError("metrics is only for agent steps")
        if self.source == "user" and self.observation is not None:
            raise ValueError("observations belong to agent and system steps")
        ids = {c.tool_call_id for c in self.tool_calls or []}
        for r in self.observation.results if self.observation else []:
            if r.source_call_id is not None and r.source_call_id not in ids:
                raise ValueError(f"source_call_id {r.source_call_id!r} names no tool call")
        return self


class Agent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Strict):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = None
    extra: dict[str, Any] | None = None


class Trajectory(_Strict):
    schema_version: Literal["ATIF-v1.7"]
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None
    subagent_trajectories: list[Trajectory] | None = None

    @model_validator(mode="after")
    def _sequential(self) -> Trajectory:
        ids = [s.step_id for s in self.steps]
        if ids != list(range(1, len(ids) + 1)):
            raise ValueError(f"step_id must count 1, 2, ...; got {ids}")
        return self
