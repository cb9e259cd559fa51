"""The engine's worker thread: admits requests, steps every active sequence together.

All model work happens on this one thread, so the asyncio loop that calls the engine (and
the proxy server sharing it) never waits on a forward pass. Requests arrive through
``submit`` with a ``concurrent.futures.Future`` each; results and errors go back through
those futures, and, for a streamed request, every sampled token goes to its ``emit`` sink
as a ``GenerationChunk`` the moment it is sampled. A request whose consumer went away is
marked ``cancelled`` and leaves the batch at the next step.

A weight update in ``"drain"`` mode waits until the running sequences finish (new ones are
held back meanwhile), swaps the weights, bumps the version, and lets the held ones in. In
``"partial"`` mode it runs at the next token boundary: the weights are swapped, the
running sequences' caches are recomputed under the new weights (prompt and tokens so far),
and they continue; each token records the version that sampled it.

Requests admitted at the same step are prefilled together (``slr_engine_hf.prefill``):
their prompts but the last token, grouped into as few forward passes as their lengths
allow; each then joins the batch, and the next decode step feeds its last prompt token with
every other row and samples its first token. Prefills go through the shared-prefix cache
(``prefix_cache.RadixPrefixCache``): a prompt runs only the tokens after its longest cached
prefix, and its KV goes into the cache right after its pass. Prompts admitted together
that share an uncached prefix do not each compute it: one goes first, the others wait one
pass and find it cached. A forced request (``forced``: the tokens to score,
``HfEngine.force_decode``) is answered by one prefill and never joins the batch. Weight
updates clear the cache.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import torch

from slr.contracts import EngineUnavailable, Generation, GenerationChunk, SamplingParams
from slr.contracts.weights import is_lora
from slr.engines.lora import load_weights
from slr_engine_hf.batch import KV, Batch
from slr_engine_hf.prefill import defer_shared, plan_passes, prefill, prefill_rows
from slr_engine_hf.prefix_cache import RadixPrefixCache
from slr_engine_hf.sampling import new_generator, sample_rows, token_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = structlog.get_logger()


@attrs.define(kw_only=True, eq=False)
class Request:
    prompt: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: Future
    generator: torch.Generator = attrs.field(init=False)
    tokens: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)  # per token: the weights version that sampled it
    routing: list[list[list[int]]] | None = None  # per token fed: per MoE layer: expert ids
    cancelled: bool = False  # set by the caller's side when it stops waiting
    # a streamed request: called on the worker thread with each new chunk (must not block)
    emit: Callable[[GenerationChunk], None] | None = None
    sent_tokens: int = 0  # how many tokens (and routing entries) went out in chunks
    sent_routing: int = 0
    stop_text_tokens: int = 0  # how many trailing tokens to decode when checking stop strings
    # forced decoding: score these tokens as the completion instead of sampling one
    forced: list[int] | None = None

    def __attrs_post_init__(self) -> None:
        self.generator = new_generator(self.sampling.seed)
        longest = max((len(s) for s in self.sampling.stop), default=0)
        self.stop_text_tokens = longest + 2 if longest else 0


@attrs.define(kw_only=True, eq=False)
class _Update:
    state_dict: Mapping[str, Any]
    version: int | None
    future: Future
    partial: bool = False


class Scheduler(threading.Thread):
    """Continuous batching over one model. Thread-safe ``submit`` / ``update`` / ``stop``."""

    def __init__(
        self,
        *,
        model: PreTrainedModel,
        tokenizer: Any,
        max_batch: int,
        max_context: int,
        eos_token_ids: set[int],
        prefix_cache_tokens: int,
        routing_k: int = 0,
        name: str = "slr-engine-hf",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_context = max_context
        self.eos_token_ids = eos_token_ids
        self.version = 0
        self.prefix_cache = RadixPrefixCache(prefix_cache_tokens)
        self.routing_k = routing_k
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._updates: deque[_Update] = deque()
        self._rows: list[Request] = []
        self._batch = Batch()
        self._error: BaseException | None = None
        self.steps = 0
        self.generated_tokens = 0
        self.cancelled = 0  # sequences dropped because their consumer went away
        self.resumed = 0  # sequences continued across a partial weight update
        self.prefill_tokens = 0  # tokens run through the model by prefills (cache misses)
        self.prefill_passes = 0  # forward passes prefills took (many prompts share one)
        self._empty: KV | None = None  # see _no_kv

    # -- called from other threads ------------------------------------------------------

    def submit(self, request: Request) -> None:
        with self._cond:
            if self._error is not None:
                raise EngineUnavailable(str(self._error))
            self._waiting.append(request)
            self._cond.notify()

    def update(
        self, state_dict: Mapping[str, Any], version: int | None, *, partial: bool = False
    ) -> Future:
        future: Future = Future()
        with self._cond:
            if self._error is not None:
                raise EngineUnavailable(str(self._error))
            self._updates.append(
                _Update(state_dict=state_dict, version=version, future=future, partial=partial)
            )
            self._cond.notify()
        return future

    def stop(self, error: BaseException) -> None:
        """Fail everything pending and in flight with ``error`` and end the thread."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify()

    @property
    def alive(self) -> bool:
        return self.is_alive() and self._error is None

    @property
    def load(self) -> int:
        with self._cond:
            return len(self._rows) + len(self._waiting)

    # -- the worker thread --------------------------------------------------------------

    def run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._error or self._waiting or self._rows or self._updates):
                        self._cond.wait()
                    if self._error is not None:
                        break
                    admit = []
                    if not self._updates:  # hold new requests back while an update waits
                        while self._waiting and len(self._rows) + len(admit) < self.max_batch:
                            admit.append(self._waiting.popleft())
                    # a drain update waits for the running rows; a partial one runs now,
                    # between two decode steps (a token boundary)
                    ready = self._updates and (not self._rows or self._updates[0].partial)
                    update = self._updates.popleft() if ready else None
                if update is not None:
                    self._drop_cancelled()
                    if self._apply_update(update) and self._rows:
                        self._recompute_rows()
                    continue
                self._drop_cancelled()
                if admit:
                    self._admit(admit)
                if self._rows:
                    self._decode_step()
        except BaseException as exc:  # a bug or a dead device: nothing may hang on it
            log.error("engine worker crashed", error=repr(exc))
            with self._cond:
                self._error = self._error or exc
        finally:
            self._fail_all()

    def _fail_all(self) -> None:
        with self._cond:
            error = self._error
            pending = [*self._rows, *self._waiting]
            updates = list(self._updates)
            self._rows, self._waiting, self._updates = [], deque(), deque()
        exc = (
            error
            if isinstance(error, EngineUnavailable)
            else EngineUnavailable(f"engine stopped: {error!r}")
        )
        for item in [*pending, *updates]:
            if not item.future.done():
                item.future.set_exception(exc)
        self._batch = Batch()
        self.prefix_cache.clear()

    def _apply_update(self, update: _Update) -> bool:
        """Swap the weights in; True when they changed (the future has the new version)."""
        if update.future.set_running_or_notify_cancel() is False:
            return False
        try:
            if is_lora(update.state_dict):
                # only the adapter travels; the base weights stay as loaded (slr.engines.lora)
                load_weights(self.model, update.state_dict)
            else:
                self._copy_state(update.state_dict)
            self.version = update.version if update.version is not None else self.version + 1
            self.prefix_cache.clear()  # cached keys/values belong to the old weights
        except BaseException as exc:
            update.future.set_exception(exc)
            return False
        update.future.set_result(self.version)
        return True

    def _copy_state(self, state_dict: Mapping[str, Any]) -> None:
        """Copy a (full or partial) state dict into the model, every name checked first."""
        model_state = self.model.state_dict()
        unknown = [k for k in state_dict if k not in model_state]
        if unknown:
            raise KeyError(
                f"update_weights got {len(unknown)} names the model does not have, e.g. "
                f"{unknown[:3]}; send the policy's own state_dict names"
            )
        for name, value in state_dict.items():  # all checked before any copy
            target = model_state[name]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(value.shape)}, the model "
                    f"expects {tuple(target.shape)}"
                )
        with torch.no_grad():
            for name, value in state_dict.items():
                target = model_state[name]
                target.copy_(value.to(device=target.device, dtype=target.dtype))

    def _recompute_rows(self) -> None:
        """After a partial update: rebuild the running rows' caches under the new weights.

        Each row's cache covers its prompt and every token but the last sampled one (which
        the next decode step feeds), exactly as if the row had run under these weights all
        along; routing recorded for those tokens stays that of the pass that first ran them.
        The rows are prefilled together, in as few passes as their lengths allow.
        """
        batch = Batch()
        rows: list[Request] = []  # in the batch's row order
        fed = [[*r.prompt, *r.tokens][:-1] for r in self._rows]
        try:
            for group in plan_passes([len(ids) for ids in fed]):
                self.prefill_passes += 1
                done = prefill_rows(self.model, [(fed[i], None, 0) for i in group])
                for i, (kv, _) in zip(group, done, strict=True):
                    rows.insert(batch.add(kv), self._rows[i])
        except Exception as exc:
            for r in self._rows:
                if not r.future.done():
                    r.future.set_exception(exc)
            with self._cond:
                self._rows = []
            self._batch = Batch()
            return
        with self._cond:
            self._rows = rows
        self._batch = batch
        self.resumed += len(self._rows)

    def _drop_cancelled(self) -> None:
        keep = [i for i, r in enumerate(self._rows) if not r.cancelled]
        if len(keep) != len(self._rows):
            self.cancelled += len(self._rows) - len(keep)
            with self._cond:
                self._rows = [self._rows[i] for i in keep]
            self._batch.keep(keep)

    def _admit(self, requests: list[Request]) -> None:
        """Prefill the requests admitted at this step and add them to the batch."""
        ready = []
        for request in requests:
            if request.cancelled:
                self.cancelled += 1
                request.future.cancel()
            elif not request.future.set_running_or_notify_cancel():
                continue
            elif request.forced is not None:
                try:
                    self._force(request, *self.prefix_cache.match(request.prompt))
                except BaseException as exc:
                    request.future.set_exception(exc)
            else:
                ready.append(request)
        held: dict[int, int] = {}  # id of a request held back: its cached prefix then
        while ready:
            # prompts admitted together that share what the cache lacks: one computes it
            # first, the others find it cached a pass later (held again only while the
            # cache keeps growing for them: a full or disabled cache lets them go)
            cached = [self.prefix_cache.reusable(r.prompt) for r in ready]
            if self.prefix_cache.enabled:
                wait = defer_shared([r.prompt for r in ready], cached)
            else:
                wait = [False] * len(ready)
            wait = [
                w and held.get(id(r), -1) < c for r, w, c in zip(ready, wait, cached, strict=True)
            ]
            held = {id(r): c for r, c in zip(ready, cached, strict=True)}
            self._join([r for r, w in zip(ready, wait, strict=True) if not w])
            ready = [r for r, w in zip(ready, wait, strict=True) if w]

    def _join(self, requests: list[Request]) -> None:
        """Prefill the requests' prompts but the last token (their uncached parts, in as
        few passes as their lengths allow) and add their rows; the next decode step feeds
        each one's last prompt token and samples its first token."""
        matched = [self.prefix_cache.match(r.prompt) for r in requests]
        # a prompt's KV: all but its last token (the decode step runs that one)
        joining: list[KV | None] = [None] * len(requests)
        todo = []
        for i, (r, (prefix, reused, routed)) in enumerate(zip(requests, matched, strict=True)):
            self.prefill_tokens += len(r.prompt) - reused
            if self.routing_k:
                r.routing = list(routed or [])
            if reused == len(r.prompt) - 1 and prefix is not None:
                joining[i] = prefix
            elif len(r.prompt) == 1:
                joining[i] = self._no_kv(r.prompt)
            else:
                todo.append(i)
        for group in plan_passes([len(requests[i].prompt) - 1 - matched[i][1] for i in todo]):
            chosen = [todo[j] for j in group]
            rows = [(requests[i].prompt[:-1], matched[i][0], matched[i][1]) for i in chosen]
            try:
                self.prefill_passes += 1
                done = prefill_rows(self.model, rows, self.routing_k)
            except BaseException as exc:
                for i in chosen:
                    requests[i].future.set_exception(exc)
                continue
            for i, (kv, routing) in zip(chosen, done, strict=True):
                request = requests[i]
                if routing is not None:
                    assert request.routing is not None
                    request.routing.extend(routing.tolist())
                # at once, not when the call ends: a request that waited for this one's
                # pass (or one admitted next) finds the shared prefix already computed
                self.prefix_cache.insert(request.prompt[:-1], kv, request.routing)
                joining[i] = kv
        for request, kv in zip(requests, joining, strict=True):
            if kv is None:  # its pass failed
                continue
            row = self._batch.add(kv)
            with self._cond:
                self._rows.insert(row, request)

    def _no_kv(self, prompt: list[int]) -> KV:
        """Empty keys and values ([1, heads, 0, dim] per layer): the cache of a one-token
        prompt before its decode step. Their shapes come from a pass over that token."""
        if self._empty is None:
            self.prefill_passes += 1
            ((kv, _),) = prefill_rows(self.model, [(prompt, None, 0)])
            self._empty = [(k[:, :, :0].clone(), v[:, :, :0].clone()) for k, v in kv]
        return self._empty

    def _force(self, request: Request, prefix: Any, reused: int, routed: list | None) -> None:
        """Forced decoding: one prefill over prompt + the given tokens (all but the last,
        which is never fed), and each given token's log-prob where it was sampled."""
        forced = request.forced
        assert forced is not None
        fed = [*request.prompt, *forced[:-1]]
        self.prefill_passes += 1
        logits, kv, routing = prefill(
            self.model, fed, prefix, reused, self.routing_k, every_position=True
        )
        self.prefill_tokens += len(fed) - reused
        if routing is not None:
            request.routing = [*(routed or []), *routing.tolist()]
        self.prefix_cache.insert(fed, kv, request.routing)
        rows = logits[len(request.prompt) - 1 - reused :]
        temps = torch.full((rows.shape[0],), float(request.sampling.temperature))
        logprobs = token_logprobs(rows.to("cpu"), temps)
        picked = logprobs.gather(1, torch.tensor(forced).unsqueeze(1)).squeeze(1).tolist()
        request.tokens, request.logprobs = list(forced), [float(x) for x in picked]
        request.versions = [self.version] * len(forced)
        self.generated_tokens += len(forced)
        last = forced[-1]
        stop = last in self.eos_token_ids or last in request.sampling.stop_token_ids
        reason = "stop" if stop else "length"
        self._emit(request, reason)
        request.future.set_result(
            Generation(
                token_ids=request.tokens,
                logprobs=request.logprobs,
                finish_reason=reason,
                routed_experts=request.routing,
                weights_version=self.version,
                weights_versions=request.versions,
                prompt_tokens=len(request.prompt),
            )
        )

    def _decode_step(self) -> None:
        rows = self._rows
        # a row that just joined feeds its last prompt token: its first sample comes next
        next_tokens = [r.tokens[-1] if r.tokens else r.prompt[-1] for r in rows]
        positions = [len(r.prompt) + len(r.tokens) - 1 for r in rows]
        try:
            logits, routing = self._batch.step(self.model, next_tokens, positions, self.routing_k)
            if routing is not None:
                for r, row_routing in zip(rows, routing.tolist(), strict=True):
                    assert r.routing is not None
                    r.routing.append(row_routing)
            tokens, lps = sample_rows(
                logits, [r.sampling for r in rows], [r.generator for r in rows]
            )
        except Exception as exc:
            for r in rows:
                if not r.future.done():
                    r.future.set_exception(exc)
            self._rows, self._batch = [], Batch()
            return
        self.steps += 1
        finished = {}
        for i, (request, tok, lp) in enumerate(zip(rows, tokens, lps, strict=True)):
            reason = self._record(request, tok, lp)
            if reason is not None:
                finished[i] = reason
            else:
                self._emit(request)
        if finished:
            self._retire(finished)

    def _record(self, request: Request, token: int, logprob: float) -> str | None:
        request.tokens.append(token)
        request.logprobs.append(logprob)
        request.versions.append(self.version)
        self.generated_tokens += 1
        return self._finish_reason(request, token)

    def _retire(self, finished: dict[int, str]) -> None:
        """Hand finished rows their Generation, keep their KV for the session, drop them."""
        done = []
        for row, reason in finished.items():
            request = self._rows[row]
            # The KV holds the prompt and every generated token but the last (never fed).
            cached = [*request.prompt, *request.tokens[:-1]]
            # not a row that ran its prompt under older weights (a partial update): its
            # recorded routing for those tokens belongs to them
            if self.prefix_cache.enabled and request.versions[0] == self.version:
                self.prefix_cache.insert(
                    cached, self._batch.row_kv(row, len(cached)), request.routing
                )
            done.append((request, reason))
        keep = [i for i in range(len(self._rows)) if i not in finished]
        with self._cond:
            self._rows = [self._rows[i] for i in keep]
        self._batch.keep(keep)
        # results go out only after the row has left, so a caller sees a consistent load
        for request, reason in done:
            if not request.future.done():
                self._emit(request, reason)
                request.future.set_result(
                    Generation(
                        token_ids=request.tokens,
                        logprobs=request.logprobs,
                        finish_reason=reason,  # type: ignore[arg-type]
                        routed_experts=request.routing,
                        weights_version=request.versions[0],
                        weights_versions=request.versions,
                        prompt_tokens=len(request.prompt),
                    )
                )

    @staticmethod
    def _emit(request: Request, reason: str | None = None) -> None:
        """Send a streamed request the tokens (and routing) it has not seen yet."""
        if request.emit is None or request.cancelled:
            return
        n, r = request.sent_tokens, request.sent_routing
        routing = request.routing[r:] if request.routing is not None else None
        request.sent_tokens = len(request.tokens)
        request.sent_routing = len(request.routing) if request.routing is not None else 0
        request.emit(
            GenerationChunk(
                token_ids=request.tokens[n:],
                logprobs=request.logprobs[n:],
                weights_versions=request.versions[n:],
                routed_experts=routing,
                finish_reason=reason,  # type: ignore[arg-type]
                prompt_tokens=len(request.prompt),
            )
        )

    def _finish_reason(self, request: Request, token: int) -> str | None:
        if token in self.eos_token_ids or token in request.sampling.stop_token_ids:
            return "stop"
        if request.stop_text_tokens:
            tail = self.tokenizer.decode(request.tokens[-request.stop_text_tokens :])
            if any(s in tail for s in request.sampling.stop):
                return "stop"
        if len(request.tokens) >= request.sampling.max_tokens:
            return "length"
        if len(request.prompt) + len(request.tokens) >= self.max_context:
            return "length"
        return None
