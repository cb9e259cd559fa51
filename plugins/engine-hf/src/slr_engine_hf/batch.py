"""The running batch: one KV cache for every active sequence, left-padded to one length.

The cache the decode steps run on grows in place (``GrowingLayer``): a step writes each
row's new key and value into a free slot instead of copying the whole cache to append them.
Sequences join and leave at any step. A newcomer joins with the keys and values of its
prompt but the last token (``slr_engine_hf.prefill`` computes them, many prompts in one
forward pass); it or the batch is padded on the left so the caches line up, and it is
inserted where the rows stay ordered longest first (sessions that join together cost one
rebuild of the batch, not one each);
leaving drops its row, moving the rows after it down in place. Between those
events every step feeds one token per row through one forward pass, with per-row
position ids and an attention mask that hides the padding, so a row computes exactly what
it would compute alone (up to float summation order). The step's attention
(``slr_engine_hf.attention``) reads the cache in place and attends each bucket of rows of
similar length only over the columns its longest row uses.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from slr_engine_hf.attention import PLAN_KWARG, DecodePlan

if TYPE_CHECKING:
    from transformers import PreTrainedModel

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, heads, L, dim]


def cache_tensors(cache: DynamicCache) -> KV:
    # transformers types ``layers`` to include linear-attention layers, which hold no keys;
    # the attention models this engine serves have key/value layers only.
    return [(layer.keys, layer.values) for layer in cache.layers]  # pyright: ignore


def make_cache(kv: KV) -> DynamicCache:
    return DynamicCache(ddp_cache_data=kv)


#: Free token slots a decode cache starts with; it doubles when they run out.
DECODE_ROOM = 64


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with room to grow.

    ``DynamicLayer.update`` appends a step's token with ``torch.cat``: a copy of the whole
    layer's cache, every step, for every row of the batch; at 32 sessions of a few hundred
    tokens that copy is as much memory traffic per step as the attention itself. Here the
    token is written into the free slot in place, and a full buffer doubles (amortised
    O(1) per token). What attention reads is the same tensor values, so logits do not change.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._len = int(keys.shape[2])
        self._k = self._buffer(keys, self._len + room)
        self._v = self._buffer(values, self._len + room)
        self._views()

    @staticmethod
    def _buffer(t: torch.Tensor, capacity: int) -> torch.Tensor:
        out = t.new_empty((t.shape[0], t.shape[1], capacity, t.shape[3]))
        out[:, :, : t.shape[2]] = t
        return out

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._k[:, :, : self._len], self._v[:, :, : self._len]
        self.keys, self.values = keys, values
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._len + key_states.shape[2]
        if end > self._k.shape[2]:
            capacity = max(end, 2 * self._k.shape[2])
            self._k = self._buffer(self._k[:, :, : self._len], capacity)
            self._v = self._buffer(self._v[:, :, : self._len], capacity)
        self._k[:, :, self._len : end] = key_states
        self._v[:, :, self._len : end] = value_states
        self._len = end
        return self._views()

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (strictly increasing), moved down in place: a row moves only
        when one before it left, and only its filled columns are copied."""
        for i, row in enumerate(rows):
            if i != row:
                self._k[i, :, : self._len] = self._k[row, :, : self._len]
                self._v[i, :, : self._len] = self._v[row, :, : self._len]
        self._k, self._v = self._k[: len(rows)], self._v[: len(rows)]
        self._views()


def make_decode_cache(kv: KV) -> DynamicCache:
    """The batch's cache for decoding: ``kv`` in ``GrowingLayer`` s."""
    cache = DynamicCache()
    layers: list[Any] = [GrowingLayer(k, v, DECODE_ROOM) for k, v in kv]
    cache.layers = layers
    cache.layer_class_to_replicate = None  # every layer is there
    return cache


def forward_with_cache(
    model: PreTrainedModel,
    cache: DynamicCache,
    routing_k: int,
    *,
    logits: bool = True,
    **inputs: Any,
) -> tuple[torch.Tensor | None, DynamicCache, torch.Tensor | None]:
    """One forward pass with a cache: (logits, cache, routing). ``routing`` is None unless
    ``routing_k`` > 0: then the top-``routing_k`` expert ids of every MoE layer for every
    token fed, [tokens (row-major over batch x sequence), layers, k]. Without ``logits``
    only the decoder runs (no output head: a prefill that only wants keys and values
    skips a [tokens, vocab] matmul). transformers renamed the ``past_key_values`` argument
    to ``cache``; both spellings are accepted."""
    if not routing_k and logits:
        out = model(**inputs, **{_cache_arg(model): cache}, use_cache=True)
        return out.logits, _cache_of(out), None
    # The causal-LM wrapper would also compute the router's auxiliary loss, which assumes
    # the attention mask covers only the tokens fed (not the cache); run the decoder and
    # the output head directly instead (the same computation as the wrapper's logits).
    decoder = getattr(model, model.base_model_prefix)
    extra = {"output_router_logits": True} if routing_k else {}
    out = decoder(**inputs, **{_cache_arg(decoder): cache}, use_cache=True, **extra)
    scores = None
    if logits:
        head = model.get_output_embeddings()
        assert head is not None  # a causal LM has its output head
        scores = head(out.last_hidden_state)
    if not routing_k:
        return scores, _cache_of(out), None
    per_layer = [r.topk(routing_k, dim=-1).indices for r in out["router_logits"]]
    return scores, _cache_of(out), torch.stack(per_layer, dim=1).to("cpu")


def _cache_arg(module: torch.nn.Module) -> str:
    name = _CACHE_ARG.get(type(module))
    if name is None:
        params = inspect.signature(type(module).forward).parameters
        name = _CACHE_ARG[type(module)] = "cache" if "cache" in params else "past_key_values"
    return name


def _cache_of(out: Any) -> DynamicCache:
    return out["cache"] if "cache" in out else out["past_key_values"]


_CACHE_ARG: dict[type, str] = {}


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    pad = t.new_zeros((*t.shape[:2], n, t.shape[3]))
    return torch.cat([pad, t], dim=2)


class Batch:
    """KV tensors, padding mask and lengths of the active rows, longest first."""

    def __init__(self) -> None:
        self._kv: KV | None = None
        # Between composition changes the model appends to one DynamicCache in place;
        # rebuilding it every step would copy the whole cache once more per step.
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # [B, L] long, 0 = padding
        self.lengths: list[int] = []  # per row: real (unpadded) tokens in the cache
        # Rows joined since the tensors were last built, in row order: an int is a row of
        # the built tensors, a KV a joining sequence. Sessions that arrive together join
        # with one copy of the batch, not one copy each (``_merge``).
        self._joining: list[int | KV] | None = None

    @property
    def kv(self) -> KV | None:
        self._merge()
        if self._cache is not None:
            self._kv, self._cache = cache_tensors(self._cache), None
        return self._kv

    @kv.setter
    def kv(self, value: KV | None) -> None:
        self._kv, self._cache = value, None

    @property
    def mask(self) -> torch.Tensor | None:
        self._merge()
        return self._mask

    @mask.setter
    def mask(self, value: torch.Tensor | None) -> None:
        self._mask = value

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        # every row is left-padded to the longest one (the cache may hold more columns
        # after rows left: ``columns``)
        return max(self.lengths, default=0)

    @property
    def columns(self) -> int:
        """Columns of the cache: ``width``, or more while columns that only rows which
        left used are still there (``keep`` in place; the next join trims them)."""
        return 0 if self._mask is None else int(self._mask.shape[1])

    def add(self, kv: KV) -> int:
        """Insert one sequence (batch dim 1, no padding); returns its row.

        Rows stay ordered longest first (ties: the earlier one first). Every row grows by
        one token a step, so the order holds between joins, and rows of similar length sit
        together: the decode step's attention buckets (``attention.DecodePlan``) are
        contiguous row ranges, so a short row is never bucketed with a long one for want
        of a neighbour. The tensors are rebuilt once, when next used."""
        n = kv[0][0].shape[2]
        row = next((i for i, m in enumerate(self.lengths) if m < n), len(self.lengths))
        if self._joining is None:
            self._joining = list(range(len(self.lengths)))
        self._joining.insert(row, list(kv))
        self.lengths.insert(row, n)
        return row

    def _merge(self) -> None:
        """Build the batch's tensors with the rows that joined: one copy of every row."""
        parts, self._joining = self._joining, None
        if parts is None:
            return
        old = cache_tensors(self._cache) if self._cache is not None else self._kv
        width = self.width
        # an old row's last columns hold all its tokens; columns beyond ``width`` (left
        # by rows that left) are padding everywhere and are dropped here
        old_width = min(self.columns, width)
        joined = next(p for p in parts if not isinstance(p, int))  # shapes and device
        merged: KV = []
        for layer in range(len(joined)):
            pair = []
            for which in (0, 1):
                like = joined[layer][which]
                out = like.new_zeros((len(parts), like.shape[1], width, like.shape[3]))
                for i, part in enumerate(parts):
                    if isinstance(part, int):
                        assert old is not None
                        out[i, :, width - old_width :] = old[layer][which][
                            part, :, old[layer][which].shape[2] - old_width :
                        ]
                    else:
                        t = part[layer][which]
                        out[i, :, width - t.shape[2] :] = t[0]
                pair.append(out)
            merged.append((pair[0], pair[1]))
        device = joined[0][0].device
        columns = torch.arange(width, device=device)
        starts = torch.tensor([width - n for n in self.lengths], device=device)
        self._kv, self._cache = merged, None
        self._mask = (columns.unsqueeze(0) >= starts.unsqueeze(1)).long()

    def row_kv(self, row: int, length: int) -> KV:
        """The last ``length`` cache entries of one row (its real tokens), copied."""
        self._merge()
        tensors = cache_tensors(self._cache) if self._cache is not None else self._kv
        assert tensors is not None
        return [
            (k[row : row + 1, :, -length:].clone(), v[row : row + 1, :, -length:].clone())
            for k, v in tensors
        ]

    @torch.inference_mode()  # the decode cache's tensors are inference tensors
    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order).

        On the decode cache, rows in their order (rows that finished or were cancelled
        leave) move down in place: a leave copies only the rows after it, once, and the
        cache keeps its columns (a bucket attends only over its own rows' columns, so
        padding on the left costs no attention; the next join drops it). Otherwise the
        batch is rebuilt without the columns that are padding everywhere."""
        self._merge()
        self.lengths = [self.lengths[r] for r in rows]
        if not rows:
            self.kv, self.mask = None, None
            return
        layers = self._cache.layers if self._cache is not None else []
        ordered = all(a < b for a, b in itertools.pairwise(rows))
        if ordered and layers and all(isinstance(x, GrowingLayer) for x in layers):
            assert self._mask is not None
            for layer in layers:
                assert isinstance(layer, GrowingLayer)
                layer.keep_rows(rows)
            index = torch.tensor(list(rows), dtype=torch.long, device=self._mask.device)
            self._mask = self._mask.index_select(0, index)
            return
        assert self.kv is not None and self.mask is not None
        index = torch.tensor(list(rows), dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else mask.shape[1]
        self.mask = mask[:, start:]
        self.kv = [
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in self.kv
        ]

    @torch.inference_mode()
    def step(
        self,
        model: PreTrainedModel,
        next_tokens: Sequence[int],
        positions: Sequence[int],
        routing_k: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed one token per row; returns the next-token logits [B, vocab] (fp32) and,
        with ``routing_k``, each row's expert ids [B, layers, k]."""
        self._merge()
        assert self.mask is not None and (self._kv is not None or self._cache is not None)
        device = self.mask.device
        input_ids = torch.tensor([[t] for t in next_tokens], dtype=torch.long, device=device)
        position_ids = torch.tensor([[p] for p in positions], dtype=torch.long, device=device)
        width = self.columns  # the cache's columns before this step's token
        mask = torch.cat([self.mask, self.mask.new_ones((self.size, 1))], dim=1)
        self.lengths = [n + 1 for n in self.lengths]
        plan = DecodePlan.for_lengths(self.lengths, width + 1)
        if self._cache is None:
            assert self._kv is not None
            self._cache = make_decode_cache(self._kv)
            self._kv = None
        attention: dict[str, Any] = {PLAN_KWARG: plan}
        logits, cache, routing = forward_with_cache(
            model,
            self._cache,
            routing_k,
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            cache_position=torch.tensor([width], dtype=torch.long, device=device),
            **attention,
        )
        assert logits is not None  # asked for
        self._cache, self.mask = cache, mask
        return logits[:, -1].float(), routing
