"""Routing replay (R3): the trainer's forward pass routes tokens through the rollout's experts.

A mixture-of-experts layer sends each token to the ``top_k`` experts its router scores
highest. The rollout engine (bf16, its own kernels) and the trainer (fp32, another batch
shape) compute slightly different router logits, and where two experts score almost the
same the two pick different ones: the token then runs through different weights, and the
trainer's log-prob of the same token differs by far more than rounding. Replaying the
rollout's choice (``Segment.routed_experts``) removes that source of mismatch.

How: a forward hook on every router module. transformers' MoE models name their router
class in ``_can_record_outputs["router_logits"]`` (what ``output_router_logits`` records;
the engine captures routing through the same modules), and each router returns
``(router_logits, gate_weights, expert_ids)``. While a replay is active the hook keeps the
trainer's own logits, swaps in the recorded expert ids for every token that has them, and
recomputes the gate weights of those experts from the trainer's logits as the router
would (softmax over all experts, then the chosen ones, renormalised when the router
renormalises its top-k), so gradients still reach the router and everything before it.
Tokens without recorded routing (a segment's last token, which no pass ran) keep the
trainer's own choice. A probe at start-up checks that this recomputation reproduces the
router's own gate weights for its own choice; a router that weighs experts some other way
(sigmoid scores, expert groups, bias-corrected top-k) is refused by name.

The hook only acts inside ``RoutingReplay.use(...)``, around one model call. Gradient
checkpointing re-runs the forward during ``backward()``, after that call returned, so the
two are refused together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from slr.contracts import RoutedExperts
from slr.errors import ConfigError

if TYPE_CHECKING:
    from slr_optimizer_torch.packing import Packed


def find_routers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE router modules, in layer order (empty for a dense model)."""
    recorded = getattr(model, "_can_record_outputs", None) or {}
    target = getattr(recorded.get("router_logits"), "target_class", None)
    if target is None:
        return []
    return [m for m in model.modules() if isinstance(m, target)]


def gate_weights(router: nn.Module, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The weights a softmax top-k router gives ``experts`` [N, k] from ``logits`` [N, E]."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights = probs.gather(-1, experts.long())
    if getattr(router, "norm_topk_prob", True):  # Mixtral's router always renormalises
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


class RoutingReplay:
    """Hooks on a MoE model's routers that replay recorded routing inside ``use``."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = find_routers(model)
        if not self.routers:
            name = getattr(getattr(model, "config", None), "model_type", None)
            raise ConfigError(
                f"routing_replay needs a MoE model; {type(model).__name__}"
                f"{f' ({name})' if name else ''} has no router. Set [algorithm] "
                f"routing_replay = false, or train a mixture-of-experts model"
            )
        self.top_k = int(getattr(self.routers[0], "top_k", 0))
        self._active: tuple[torch.Tensor, torch.Tensor] | None = None
        self.replayed = 0  # token-layers routed as recorded, over the replays so far
        self.changed = 0  # of those, the ones whose recorded experts differ from the trainer's
        problem = self._probe()
        if problem is not None:
            raise ConfigError(f"routing_replay cannot replay this model: {problem}")
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    @property
    def layers(self) -> int:
        return len(self.routers)

    def _probe(self) -> str | None:
        router = self.routers[0]
        weight = next(router.parameters(), None)
        if weight is None or weight.dim() != 2:
            return f"{type(router).__name__} has no [experts, hidden] weight"
        hidden = torch.randn(
            (5, int(weight.shape[1])),
            dtype=weight.dtype,
            device=weight.device,
            generator=torch.Generator().manual_seed(0) if weight.device.type == "cpu" else None,
        )
        with torch.no_grad():
            out = router(hidden)
        if not (isinstance(out, tuple) and len(out) == 3):
            return f"{type(router).__name__} does not return (logits, weights, expert ids)"
        logits, weights, experts = out
        again = gate_weights(router, logits, experts).to(weights.dtype)
        if not torch.allclose(again.float(), weights.float(), atol=1e-3, rtol=1e-3):
            return (
                f"{type(router).__name__} weighs its experts other than softmax then top-k "
                f"(with norm_topk_prob); its gate weights cannot be recomputed for replayed "
                f"experts"
            )
        return None

    def _hook(self, layer: int):
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            if self._active is None:
                return None
            experts, valid = self._active
            logits, weights, own = output
            if experts.shape[0] != own.shape[0]:
                raise RuntimeError(
                    f"routing replay has {experts.shape[0]} tokens but the router of MoE "
                    f"layer {layer} saw {own.shape[0]}"
                )
            recorded = experts[:, layer].to(own.device)
            keep = valid.to(own.device)[:, None]
            chosen = torch.where(keep, recorded, own.to(recorded.dtype)).to(own.dtype)
            with torch.no_grad():
                same = (recorded.sort(-1).values == own.sort(-1).values).all(-1, keepdim=True)
                self.replayed += int(keep.sum())
                self.changed += int((keep & ~same).sum())
            return logits, gate_weights(module, logits, chosen).to(weights.dtype), chosen

        return hook

    @contextmanager
    def use(self, experts: torch.Tensor, valid: torch.Tensor) -> Iterator[None]:
        """Replay ``experts`` [tokens, layers, top_k] where ``valid`` [tokens] is true, for
        the model calls inside; tokens are the model input's, flattened row-major."""
        if experts.shape[1:] != (self.layers, self.top_k):
            raise ValueError(
                f"recorded routing has {experts.shape[1]} MoE layers x top_k "
                f"{experts.shape[2]} but the model has {self.layers} routers x top_k "
                f"{self.top_k}: was it recorded with another model?"
            )
        self._active = (experts, valid)
        try:
            yield
        finally:
            self._active = None

    def layout(
        self,
        routing: Sequence[RoutedExperts | None],
        width: int,
        packed: Packed | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The (experts, valid) of a model input: rows ``routing`` (one per input row, each
        from its first token) laid out as ``[rows, width]`` flattened, or, with ``packed``,
        at each token's position in the packed sequence."""
        tokens = packed.tokens if packed is not None else len(routing) * width
        experts = torch.zeros((tokens, self.layers, self.top_k), dtype=torch.long)
        valid = torch.zeros(tokens, dtype=torch.bool)
        for row, routed in enumerate(routing):
            if routed is None or not len(routed):
                continue
            n = min(len(routed), width)
            ids = _tensor(routed)[:n]
            if ids.shape[1:] != experts.shape[1:]:
                raise ValueError(
                    f"recorded routing has {routed.layers} MoE layers x top_k {routed.top_k} "
                    f"but the model has {self.layers} routers x top_k {self.top_k}: was it "
                    f"recorded with another model?"
                )
            if packed is not None:
                where = packed.index[row, :n]
            else:
                where = torch.arange(row * width, row * width + n)
            experts[where] = ids
            valid[where] = True
        return experts, valid


def _tensor(routed: RoutedExperts) -> torch.Tensor:
    values = np.frombuffer(routed.data, dtype="<u2" if routed.dtype == "uint16" else np.uint8)
    return torch.from_numpy(values.astype(np.int64)).view(len(routed), routed.layers, routed.top_k)
