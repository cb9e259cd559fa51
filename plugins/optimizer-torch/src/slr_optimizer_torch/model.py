"""Loading the policy and scoring tokens under the engine's log-prob definition.

The definition is shared with every engine: the log-prob of a sampled token is
``log_softmax(logits / temperature)`` over the full vocabulary, before any top-k / top-p
truncation (``slr.contracts.Generation``). The trainer scores with the rollout temperature,
in float32, so behaviour and trainer log-probs agree to rounding when the weights match.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import torch
from torch import nn

from slr_optimizer_torch import packing
from slr_optimizer_torch.packing import Packed

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = structlog.get_logger()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_model_name(name: str) -> str:
    """The folder for an engine-side model name, so trainer and engine load the same weights.

    With ``slr-engine-hf`` installed, its packaged names (``smollm2-135m-instruct``) and
    ``.gguf`` files resolve to the folder it converts them into, and Hub ids
    (``Org/Name``) to their snapshot in the local Hub cache, by the engine's own resolver;
    anything else (a model folder) is passed to ``from_pretrained`` unchanged.
    """
    try:
        from slr_engine_hf.models import PACKAGED, is_hub_id, resolve
    except ImportError:
        return name
    if name in PACKAGED or name.endswith(".gguf") or is_hub_id(name):
        return str(resolve(name))
    return name


def load_causal_lm(
    name_or_path: str, *, dtype: torch.dtype, device: torch.device
) -> PreTrainedModel:
    """A Hugging Face causal LM from a folder (or hub id), in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    from slr.errors import ConfigError

    if not name_or_path:
        raise ConfigError(
            "the torch optimizer has no model to train: set [optimizer] model (a Hugging Face "
            "model folder), or [engine] model for the engine and optimizer together"
        )
    name_or_path = resolve_model_name(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except OSError as exc:
        raise ConfigError(
            f"cannot load model {name_or_path!r} for training: {exc}. Point [optimizer] model "
            f"at a Hugging Face model folder (config.json + weights)."
        ) from exc
    # PreTrainedModel.to is wrapped in a decorator whose annotations lose the bound self.
    return model.to(device)  # pyright: ignore[reportArgumentType]


@attrs.define
class Scores:
    """Per-token outputs shaped like the response mask ``(B, L-1)``; zero off the mask."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


#: Rows of hidden states per chunk of verl's fused linear-for-PPO (its own default): the
#: most logits, ``chunk x vocabulary`` in float32, that exist at once.
FUSED_CHUNK = 512


class Scorer:
    """Scores the policy tokens of a micro-batch: log-probs, entropy, values.

    The LM head runs only on the positions that predict a policy token (prompt and tool
    output tokens usually dominate agent trajectories), when the model's logits are exactly
    its output embedding applied to its decoder's last hidden state; a one-time check on a
    short input decides, and models with extra logit processing (soft-capping, scaling) use
    the full forward instead.

    ``fused`` (``[optimizer] use_fused_kernels``) goes one step further: the policy
    positions' hidden states and the head's weight go to verl's fused linear-for-PPO
    (``FusedLinearForPPO``, its torch backend), which computes log-probs and entropy a
    chunk of positions at a time and recomputes each chunk's logits in the backward, so no
    ``tokens x vocabulary`` tensor is ever held. A model whose logits are not
    ``hidden @ head.weight.T`` (a head with a bias or a LoRA adapter, soft-capping, ...)
    is refused, since the fused function would score a different distribution.
    """

    def __init__(self, model: PreTrainedModel, *, temperature: float, fused: bool = False) -> None:
        from slr.errors import ConfigError

        if temperature <= 0:
            raise ConfigError(
                f"rollout.temperature = {temperature} cannot be trained on: greedy decoding has "
                f"no sampling distribution to score. Use a temperature > 0 (1.0 is usual)."
            )
        self.model = model
        self.temperature = float(temperature)
        self.selective = self._head_is_separable()
        self.fused: Any = None  # verl's FusedLinearForPPO module when fused
        if fused:
            problem = self.fused_problem()
            if problem is not None:
                raise ConfigError(
                    f"[optimizer] use_fused_kernels = true cannot score "
                    f"{type(model).__name__}: {problem}. Set use_fused_kernels = false"
                )
            from verl.utils.experimental.torch_functional import FusedLinearForPPO

            self.fused = FusedLinearForPPO(chunk_size=FUSED_CHUNK, impl_backend="torch")

    def fused_problem(self) -> str | None:
        """Why verl's fused linear-for-PPO would not score this model's logits (None: it would).

        The fused function computes ``hidden @ weight.T``: the head must be a plain linear
        layer without a bias (a peft LoRA layer on the head would be left out), and the
        model's logits must be exactly that (no soft-capping or scaling).
        """
        head = self.model.get_output_embeddings()
        if head is None or getattr(self.model, "get_decoder", None) is None:
            return "it has no separate decoder and output head"
        if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
            return (
                f"its output head is a {type(head).__name__}, not a plain linear layer (a LoRA "
                f"adapter on the head? leave lm_head out of target_modules)"
            )
        if head.bias is not None:
            return "its output head has a bias, which the fused function does not add"
        if not self.selective:
            return "its logits are not the output head applied to the last hidden state"
        return None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _head_is_separable(self) -> bool:
        get_decoder = getattr(self.model, "get_decoder", None)
        head = self.model.get_output_embeddings()
        if get_decoder is None or head is None:
            return False
        vocab = int(head.weight.shape[0])
        probe = (torch.arange(12, device=self.device) * 7919 % vocab).unsqueeze(0)
        try:
            with torch.no_grad():
                full = self.model(input_ids=probe).logits.float()
                hidden = get_decoder()(input_ids=probe).last_hidden_state
                split = head(hidden).float()
        except Exception as exc:  # an architecture without the usual decoder / head split
            log.debug("optimizer.scorer.full_forward", reason=repr(exc))
            return False
        same = full.shape == split.shape and torch.allclose(full, split, atol=1e-5, rtol=1e-5)
        if not same:
            log.info("optimizer.scorer.full_forward", reason="logits are not head(hidden)")
        return same

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        entropy: bool = True,
        entropy_grad: bool = False,
        value_head: nn.Module | None = None,
        packed: Packed | None = None,
    ) -> Scores:
        """Scores of the rows ``input_ids`` (right-padded, ``attention_mask``).

        With ``packed`` (the same rows as a prefix tree, ``packing.pack``), the forward runs
        on the tree and each row's positions are gathered from it; the outputs are the same.
        """
        select = response_mask > 0
        targets = input_ids[:, 1:][select]
        if packed is None:
            inputs: dict[str, torch.Tensor] = {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
            }

            def pick(out: torch.Tensor) -> torch.Tensor:
                return out[:, :-1][select]
        else:
            param = next(self.model.parameters())
            inputs = packed.model_inputs(
                param.device, param.dtype, boolean=self._attention() == "sdpa"
            )
            where = packed.index[:, :-1].to(param.device)[select]

            def pick(out: torch.Tensor) -> torch.Tensor:
                return out[0, where]

        hidden: torch.Tensor | None = None
        if self.fused is not None or self.selective or value_head is not None:
            hidden = pick(self.model.get_decoder()(**inputs).last_hidden_state)
        if self.fused is not None:
            assert hidden is not None
            out = self._score_fused(hidden, targets, select, entropy, entropy_grad)
            if value_head is not None:
                out.values = _scatter(value_head(hidden.float()).squeeze(-1), select)
            return out
        if self.selective:
            head = self.model.get_output_embeddings()
            assert head is not None and hidden is not None  # selective: _head_is_separable found it
            logits = head(hidden)
        else:
            logits = pick(self.model(**inputs).logits)
        logits = logits.float() / self.temperature
        from verl.utils import torch_functional as verl_F

        # One (1, N, V) block: verl's float32 path loops over the leading dimension in Python.
        logprobs = verl_F.logprobs_from_logits(logits.unsqueeze(0), targets.unsqueeze(0))[0]
        out = Scores(logprobs=_scatter(logprobs, select))
        if entropy:
            if entropy_grad:
                out.entropy = _scatter(verl_F.entropy_from_logits(logits), select)
            else:
                with torch.no_grad():
                    out.entropy = _scatter(verl_F.entropy_from_logits(logits.detach()), select)
        if value_head is not None:
            assert hidden is not None
            out.values = _scatter(value_head(hidden.float()).squeeze(-1), select)
        return out

    def _score_fused(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        select: torch.Tensor,
        entropy: bool,
        entropy_grad: bool,
    ) -> Scores:
        head = self.model.get_output_embeddings()
        assert head is not None and self.fused is not None  # fused_problem found the head
        logprobs, ent = self.fused(hidden, head.weight, targets, self.temperature)
        out = Scores(logprobs=_scatter(logprobs, select))
        if entropy:
            # a detached entropy gets no gradient, and verl's backward then skips its term
            ent = ent.float() if entropy_grad else ent.detach().float()
            out.entropy = _scatter(ent, select)
        return out

    def _attention(self) -> str | None:
        return getattr(getattr(self.model, "config", None), "_attn_implementation", None)

    def tree_packing_problem(self) -> str | None:
        """Why packed scoring would not be exact for this model (None: it is).

        The configuration is checked first (``packing.unsupported``); then two rows that
        share a prefix are scored as copies and as a tree, and must agree to rounding.
        """
        reason = packing.unsupported(self.model)
        if reason is not None:
            return reason
        head = self.model.get_output_embeddings()
        vocab = int(head.weight.shape[0]) if head is not None else 2
        rows = [
            [(i * 7919) % vocab for i in range(1, 13)],
            [(i * 104729) % vocab for i in range(1, 9)],
        ]
        rows[1][:5] = rows[0][:5]  # a shared prefix of five tokens, then a branch
        width = max(len(r) for r in rows)
        ids = torch.zeros((2, width), dtype=torch.long)
        mask = torch.zeros((2, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        response = mask[:, 1:].float()
        lengths = mask.sum(-1)
        device = self.device
        with torch.no_grad():
            copies = self(ids.to(device), mask.to(device), response.to(device), entropy=False)
            tree = self(
                ids.to(device),
                mask.to(device),
                response.to(device),
                entropy=False,
                packed=packing.pack([0, 1], ids, lengths),
            )
        tol = 1e-4 if next(self.model.parameters()).dtype == torch.float32 else 5e-2
        gap = float((copies.logprobs - tree.logprobs).abs().max())
        if not gap <= tol:
            return f"packed log-probs differ from per-row ones by {gap:.2e} on a probe"
        return None


def _scatter(values: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(select.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(select, values)


class ValueHead(nn.Module):
    """gae's critic: a linear value on the policy's last hidden state (a shared trunk)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.linear.weight, std=1.0 / (hidden_size + 1) ** 0.5)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)


def hidden_size(model: PreTrainedModel) -> int:
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output head to size a value head by")
    return int(head.weight.shape[1])


def tokenizer_files(folder: Any) -> list[Path]:
    """Files beside a model's weights that make a checkpoint loadable as a whole model."""
    if not folder or not Path(folder).is_dir():
        return []
    names = (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "chat_template.jinja",
        "generation_config.json",
    )
    return [Path(folder) / n for n in names if (Path(folder) / n).is_file()]
