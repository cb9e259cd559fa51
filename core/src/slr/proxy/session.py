"""One session's state and the API-neutral model call both protocols go through."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import structlog
from attrs import define, evolve, field, frozen

from slr.contracts import (
    ContextOverflow,
    Engine,
    EngineUnavailable,
    Generation,
    SamplingParams,
    TerminationReason,
    Trajectory,
)
from slr.contracts.engine import ChunkCollector
from slr.proxy.accumulator import Accumulator, Prepared
from slr.proxy.errors import ApiError
from slr.proxy.messages import Message, Tool, ToolCall
from slr.proxy.render import Renderer
from slr.proxy.toolparse import ToolParser
from slr.rollout.costs import ModelClock

log = structlog.get_logger()

Finish = Literal["stop", "length", "tool_calls", "stop_sequence"]


@frozen(kw_only=True)
class ChatRequest:
    """A model call, whichever API it came from."""

    api: Literal["openai", "anthropic"]
    messages: tuple[Message, ...] = field(converter=tuple)
    tools: tuple[Tool, ...] = field(default=(), converter=tuple)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = field(default=(), converter=tuple)
    seed: int | None = None
    parse_tools: bool = True
    want_tokens: bool = False  # per-token text and log-probs (OpenAI logprobs, streaming)


@frozen(kw_only=True)
class ChatResult:
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish: Finish
    stop_sequence: str | None
    prompt_tokens: int
    reused_tokens: int
    completion_tokens: int
    tokens: tuple[tuple[str, float], ...]  # generated tokens shown to the agent: (text, log-prob)


@frozen(kw_only=True)
class Started:
    """A live stream's first event: the engine has sampled its first token."""

    prompt_tokens: int
    reused_tokens: int


@frozen(kw_only=True)
class TextDelta:
    """Text the agent may be shown now: final content, never taken back."""

    text: str


StreamEvent = Started | TextDelta | ChatResult


class CallTimer:
    """Where one call's time went, as marks on ``time.perf_counter``: arrival (body
    decoded), the session's lock taken, the prompt prepared (chat template, tokenization,
    prefix reuse), the engine's first and last token. ``as_ms`` turns them into the
    ``timing_ms`` of the call's turn record, so a slow call in a transcript says whether it
    waited on the session, on the proxy's own work or on the engine."""

    __slots__ = ("arrived", "first_token", "last_token", "locked", "submitted")

    def __init__(self) -> None:
        self.arrived = time.perf_counter()
        self.locked = self.submitted = self.first_token = self.last_token = self.arrived

    def lock_taken(self) -> None:
        self.locked = time.perf_counter()

    def engine_submitted(self) -> None:
        self.submitted = self.first_token = self.last_token = time.perf_counter()

    def token(self, *, first: bool) -> None:
        self.last_token = time.perf_counter()
        if first:
            self.first_token = self.last_token

    def as_ms(self) -> dict[str, float]:
        def ms(a: float, b: float) -> float:
            return round(1000 * (b - a), 3)

        return {
            "lock_wait": ms(self.arrived, self.locked),
            "prepare": ms(self.locked, self.submitted),
            "first_token": ms(self.submitted, self.first_token),
            "engine": ms(self.submitted, self.last_token),
            "after_engine": ms(self.last_token, time.perf_counter()),
        }


_T = TypeVar("_T")


def call_seed(base: int | None, trial_id: str, call: int) -> int | None:
    """The sampling seed of call number ``call`` (0-based) of trial ``trial_id`` under the
    base seed ``base`` (``[run] seed``); None without a base (fresh entropy per call).

    A pure function of the three, so a trial samples the same tokens whichever other
    requests share the engine's batch and whenever it runs; the trials of one group differ
    by their ids, the calls of one trial by their number."""
    if base is None:
        return None
    digest = hashlib.blake2b(f"{base}:{trial_id}:{call}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: every engine takes that


def new_token() -> str:
    """A session token: 256 random bits (``secrets``), URL-safe, so it can sit in a path."""
    return "slr-" + secrets.token_urlsafe(32)


@define
class SessionState:
    trial_id: str
    token: str  # the secret: the session's URL part and API key; never logged, never sent on
    accumulator: Accumulator
    lock: asyncio.Lock = field(factory=asyncio.Lock)
    closed: bool = False
    # what the engine (and a load balancer's pins, its logs) knows the session by: not the
    # token, which must not travel further than the proxy
    engine_id: str = field(factory=lambda: "sess-" + secrets.token_hex(8))
    # cancels the calls in flight when the session closes (see ``close``)
    _on_close: set[Callable[[], None]] = field(factory=set, repr=False)
    termination: TerminationReason | None = None
    turns: list[dict[str, Any]] = field(factory=list)
    # the last call's messages plus the reply it got, and the tools it offered: the
    # conversation as the agent last saw it (after any history rewrite)
    conversation: tuple[Message, ...] = ()
    tools: tuple[Tool, ...] = ()
    clock: ModelClock = field(factory=ModelClock)  # first call, time waiting on the engine

    def close(self) -> None:
        """Refuse every later call and cancel the ones in flight: their client, or the
        trial that ran it, has given up (an agent timeout), and the engine capacity they
        hold belongs to live trials. Safe from any thread."""
        self.closed = True
        for cancel in list(self._on_close):
            cancel()

    async def until_closed(self, work: Awaitable[_T]) -> _T:
        """Await ``work``; if the session closes meanwhile, cancel it and refuse the call."""
        task = asyncio.ensure_future(work)
        loop = asyncio.get_running_loop()

        def cancel() -> None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop is gone, and the task with it
                pass

        self._on_close.add(cancel)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and self.closed and not (current and current.cancelling()):
                raise _closed_while_generating() from None
            raise
        finally:
            self._on_close.discard(cancel)

    def trajectory(self) -> Trajectory:
        return Trajectory(
            session_id=self.trial_id,
            segments=self.accumulator.segments_frozen(),
            num_calls=self.accumulator.calls,
        )


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class SessionTable:
    """The open sessions by token: the one place a request's token becomes its session.

    A token matches only itself, byte for byte: no prefix, case or normalisation games.
    Sessions are found by a digest of the token, so how long a dictionary probe takes says
    nothing about how much of a guess was right, and the match is confirmed with
    ``hmac.compare_digest``. A closed session's token is dead for good: the table keeps the
    digests of the last ``remember_closed`` closed tokens so that a late call gets a clear
    "this session is closed" instead of "unknown token".
    """

    def __init__(self, *, remember_closed: int = 65536) -> None:
        self._by_digest: dict[bytes, SessionState] = {}
        self._closed: OrderedDict[bytes, None] = OrderedDict()
        self._remember_closed = remember_closed

    def __len__(self) -> int:
        return len(self._by_digest)

    def add(self, state: SessionState) -> None:
        key = _digest(state.token)
        if key in self._by_digest or key in self._closed:
            raise ValueError("session token already in use; tokens come from new_token()")
        self._by_digest[key] = state

    def pop(self, token: str) -> SessionState | None:
        key = _digest(token)
        state = self._by_digest.pop(key, None)
        if state is not None:
            self._closed[key] = None
            while len(self._closed) > self._remember_closed:
                self._closed.popitem(last=False)
        return state

    def lookup(self, token: str | None) -> SessionState:
        """The open session of ``token``; an authentication error in the caller's API if none."""
        if not token:
            raise ApiError(
                "authentication",
                "no session token: call the base URL from open_session() "
                "(http://host:port/s/<token>/...) or send the token as the API key",
            )
        key = _digest(token)
        state = self._by_digest.get(key)
        if state is not None and hmac.compare_digest(_digest(state.token), key):
            if not state.closed:
                return state
        elif key not in self._closed:
            raise ApiError(
                "authentication",
                "no session has this token: use the base URL or API key that open_session() "
                "gave this trial",
            )
        raise ApiError(
            "authentication",
            "this session is closed (its trial's agent phase has ended); nothing more is "
            "recorded for it: open a new session",
        )


class Completer:
    """Render, generate, parse and record one call. Shared by the OpenAI and Anthropic routes."""

    def __init__(
        self,
        engine: Engine,
        renderer: Renderer,
        parser: ToolParser,
        defaults: SamplingParams,
        *,
        honor_client_sampling: bool = True,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.parser = parser
        self.defaults = defaults
        self.honor_client_sampling = honor_client_sampling
        # Families that keep generating after a call (gemma4) name the token to stop on.
        markers = getattr(parser, "stop_markers", ())
        extra = {t for m in markers if (t := renderer.single_token(m)) is not None}
        self.stop_token_ids = tuple(sorted(renderer.stop_token_ids | extra))
        self.special_tokens = bool(getattr(parser, "special_tokens", False))

    def count(self, state: SessionState, messages: Sequence[Message], tools: Sequence[Tool]) -> int:
        return len(state.accumulator.prepare(messages, tools).prompt_ids)

    async def complete(self, state: SessionState, req: ChatRequest) -> ChatResult:
        timer = CallTimer()
        state.clock.call_arrived()
        async with state.lock:
            timer.lock_taken()
            prepared, sampling = self._prepare(state, req)
            waiting = state.clock.engine_started()
            timer.engine_submitted()
            try:
                gen = await state.until_closed(
                    self.engine.generate(prepared.prompt_ids, sampling, session_id=state.engine_id)
                )
            except ContextOverflow:
                raise self._overflow(state, len(prepared.prompt_ids)) from None
            except EngineUnavailable as exc:
                raise _unavailable(exc) from exc
            finally:
                state.clock.engine_ended(waiting)
            timer.token(first=True)  # a whole generation: first and last token arrive together
            result = self._result(req, gen, len(prepared.prompt_ids), prepared)
            return self._record(state, req, prepared, gen, result, timer)

    async def stream(self, state: SessionState, req: ChatRequest) -> AsyncIterator[StreamEvent]:
        """One call, live: ``Started`` once the first token exists, then ``TextDelta``s as
        the engine samples, then the ``ChatResult`` (tool calls are parsed at the end).

        Text that could still turn out to be a stop string or the start of a tool call is
        held back until it cannot. A consumer that stops early cancels the generation, and
        nothing of that call is recorded (the agent never received a whole reply).
        """
        timer = CallTimer()
        state.clock.call_arrived()
        async with state.lock:
            timer.lock_taken()
            prepared, sampling = self._prepare(state, req)
            n_prompt = len(prepared.prompt_ids)
            marker = (
                getattr(self.parser, "start_marker", None)
                if req.parse_tools and req.tools
                else None
            )
            visible = _Visible(self.renderer, req.stop, marker, special=self.special_tokens)
            collector = ChunkCollector()
            chunks = self.engine.stream(prepared.prompt_ids, sampling, session_id=state.engine_id)
            shown = ""
            complete = False
            # the whole stream counts as waiting on the engine: between chunks the proxy
            # only hands text to the agent, which is waiting for it
            waiting = state.clock.engine_started()
            timer.engine_submitted()
            try:
                async for chunk in chunks:
                    timer.token(first=not collector.token_ids)
                    if not collector.token_ids and chunk.token_ids:
                        yield Started(
                            prompt_tokens=n_prompt, reused_tokens=n_prompt - len(prepared.new_ids)
                        )
                    if state.closed:  # within one token of the close: the engine stops
                        raise _closed_while_generating()
                    collector.add(chunk)
                    if chunk.finish_reason is not None:
                        complete = True
                        break
                    text = visible.text(collector.token_ids)
                    if len(text) > len(shown) and text.startswith(shown):
                        yield TextDelta(text=text[len(shown) :])
                        shown = text
            except ContextOverflow:
                raise self._overflow(state, n_prompt) from None
            except EngineUnavailable as exc:
                raise _unavailable(exc) from exc
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]
                state.clock.engine_ended(waiting)
                if not complete:
                    log.info(
                        "proxy.stream_cancelled",
                        trial_id=state.trial_id,
                        generated_tokens=len(collector.token_ids),
                    )
            gen = collector.generation()
            result = self._result(req, gen, n_prompt, prepared)
            # The reply the agent holds is what it was streamed plus the rest of the final
            # content; record exactly that, so its next request extends this segment.
            rest = result.content[len(shown) :] if result.content.startswith(shown) else ""
            result = evolve(result, content=shown + rest)
            yield self._record(state, req, prepared, gen, result, timer)

    def _prepare(self, state: SessionState, req: ChatRequest) -> tuple[Prepared, SamplingParams]:
        if state.closed:
            raise ApiError(
                "authentication", "this session is closed; nothing more is recorded for it"
            )
        prepared = state.accumulator.prepare(req.messages, req.tools)
        n_prompt = len(prepared.prompt_ids)
        room = self.engine.max_context - n_prompt
        if room < 1:
            raise self._overflow(state, n_prompt)
        d = self.defaults
        # In training the agent's sampling choices are ignored: the trainer scores tokens
        # at [rollout] temperature, so the engine must sample at exactly that one.
        honor = self.honor_client_sampling
        sampling = SamplingParams(
            temperature=req.temperature if honor and req.temperature is not None else d.temperature,
            top_p=req.top_p if honor and req.top_p is not None else d.top_p,
            top_k=req.top_k if honor and req.top_k is not None else d.top_k,
            max_tokens=max(1, min(req.max_tokens or d.max_tokens, d.max_tokens, room)),
            stop=req.stop,
            stop_token_ids=self.stop_token_ids,
            seed=call_seed(d.seed, state.trial_id, state.accumulator.calls)
            if req.seed is None or not honor
            else req.seed,
        )
        return prepared, sampling

    def _record(
        self,
        state: SessionState,
        req: ChatRequest,
        prepared: Prepared,
        gen: Generation,
        result: ChatResult,
        timer: CallTimer,
    ) -> ChatResult:
        reply = Message(role="assistant", content=result.content, tool_calls=result.tool_calls)
        if state.closed:  # closed while generating: answer, but the trajectory is final
            return result
        seg = state.accumulator.commit(prepared, gen, reply)
        state.conversation, state.tools = (*req.messages, reply), req.tools
        versions = sorted(set(gen.weights_versions))
        state.turns.append(
            {
                "call": state.accumulator.calls,
                "api": req.api,
                "segment": seg.index,
                "mode": prepared.mode,
                **(
                    {"parent": seg.parent.index, "branch_at": seg.branch_at}
                    if prepared.segment is None and seg.parent is not None
                    else {}
                ),
                "prompt_tokens": len(prepared.prompt_ids),
                "new_prompt_tokens": len(prepared.new_ids),
                "new_prompt_text": self.renderer.decode(prepared.new_ids),
                "completion_tokens": len(gen.token_ids),
                "completion_text": self.renderer.decode(gen.token_ids),
                "finish_reason": result.finish,
                "tool_calls": [
                    {"name": c.name, "arguments": c.arguments} for c in result.tool_calls
                ],
                "weights_version": gen.weights_version,
                **({"weights_versions": versions} if len(versions) > 1 else {}),
                "seconds": round(time.perf_counter() - timer.locked, 4),
                "timing_ms": timer.as_ms(),
            }
        )
        return result

    def _overflow(self, state: SessionState, n_prompt: int) -> ApiError:
        state.termination = TerminationReason.CONTEXT_OVERFLOW
        limit = self.engine.max_context
        log.info("proxy.context_overflow", trial_id=state.trial_id, prompt_tokens=n_prompt)
        return ApiError(
            "context_overflow",
            f"prompt is too long: {n_prompt} tokens > {limit - 1} maximum "
            f"(the model's context is {limit} tokens, including at least one to generate)",
            param="messages",
        )

    def _result(self, req: ChatRequest, gen, n_prompt: int, prepared) -> ChatResult:
        ids = list(gen.token_ids)
        stopped_on_token = bool(ids) and ids[-1] in self.renderer.stop_token_ids
        shown = ids[:-1] if stopped_on_token else ids
        parse = bool(req.parse_tools and req.tools)
        # A family whose markup is in special tokens is parsed from the text with them kept,
        # its final token included (gpt-oss's <|call|> closes a call); the agent is shown the
        # content without them.
        special = parse and self.special_tokens
        text = self.renderer.decode(ids if special else shown, skip_special=not special)
        stop_sequence = None
        cut = [(text.find(s), s) for s in req.stop if s and s in text]
        if cut:
            at, stop_sequence = min(cut)
            text = text[:at]
        if parse:
            parsed = self.parser.parse(text, req.tools)
            content, calls = parsed.content, parsed.tool_calls
        else:
            content, calls = text, ()
        if special:
            content = self.renderer.strip_special(content)
        if calls:
            finish: Finish = "tool_calls"
        elif stop_sequence is not None:
            finish = "stop_sequence"
        elif gen.finish_reason == "length" and not stopped_on_token:
            finish = "length"
        else:
            finish = "stop"
        tokens = ()
        if req.want_tokens:
            tokens = tuple(
                (self.renderer.decode([t]), float(lp))
                for t, lp in zip(shown, gen.logprobs[: len(shown)], strict=True)
            )
        return ChatResult(
            content=content,
            tool_calls=calls,
            finish=finish,
            stop_sequence=stop_sequence,
            prompt_tokens=n_prompt,
            reused_tokens=n_prompt - len(prepared.new_ids),
            completion_tokens=len(ids),
            tokens=tokens,
        )


def _closed_while_generating() -> ApiError:
    return ApiError(
        "authentication",
        "the session was closed while this call was generating (its trial ended); the "
        "generation was cancelled and nothing of this call was recorded",
    )


def _unavailable(exc: EngineUnavailable) -> ApiError:
    return ApiError("engine_unavailable", f"the policy engine is unavailable: {exc}")


class _Visible:
    """The part of a live generation's text that is final: not inside or possibly the
    start of a stop string or a tool call, and not a partly decoded character."""

    def __init__(
        self, renderer: Renderer, stops: Sequence[str], marker: str | None, *, special: bool
    ) -> None:
        self.renderer = renderer
        # A marker that is one special token never shows in the text decoded without
        # special tokens: find it among the ids instead.
        self.marker_id = renderer.single_token(marker) if marker and special else None
        self.cuts = [s for s in (*stops, marker or "") if s]
        self.hold = max((len(s) for s in self.cuts), default=1) - 1

    def text(self, ids: Sequence[int]) -> str:
        if self.marker_id is not None and self.marker_id in ids:
            ids = ids[: list(ids).index(self.marker_id)]
        text = self.renderer.decode(ids, skip_special=True)
        end = len(text.rstrip("\ufffd")) - self.hold
        for cut in self.cuts:
            at = text.find(cut)
            if at >= 0:
                end = min(end, at)
        return text[: max(end, 0)]
