"""``[optimizer] use_fused_kernels``: verl's fused linear-for-PPO scores what the unfused
path scores. On tiny fp32 models, per-token log-probs, entropy, a PPO-style loss and every
parameter's gradient agree within 1e-5, with tree packing, routing replay and LoRA; whole
optimizer steps agree; a model the fused function would mis-score is refused by name."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
from slr_optimizer_torch import packing
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import Scorer
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.replay import RoutingReplay
from slr_optimizer_torch.testing import tiny_causal_lm, trial

from slr.config import AlgorithmSection
from slr.engines import lora as adapter_format
from slr.errors import ConfigError
from slr_testkit import tiny

pytestmark = pytest.mark.timeout(60)

TOL = 1e-5
TEMPERATURE = 0.7
VOCAB = 300
# rows sharing a prefix (so the tree packs them), of different lengths (padding)
ROWS = [
    [5, 17, 42, 9, 101, 7, 250, 33, 61, 2, 88, 19, 140],
    [5, 17, 42, 9, 101, 64, 3, 77, 12],
    [8, 200, 150, 4, 99, 31, 45, 23, 6, 71, 180],
]
PROMPT = 4  # the first tokens of each row are prompt, the rest policy


def _batch(rows=ROWS):
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    response = mask[:, 1:].float()
    response[:, : PROMPT - 1] = 0
    return ids, mask, response


def _score(scorer: Scorer, model, *, pack: bool, chunk: int | None = None, around=nullcontext):
    """Log-probs, entropy and gradients of a loss that uses both (as the PPO loss does)."""
    if chunk is not None:
        scorer.fused.chunk_size = chunk
    ids, mask, response = _batch()
    packed = packing.pack(range(len(ROWS)), ids, mask.sum(-1)) if pack else None
    model.zero_grad(set_to_none=True)
    with around():
        s = scorer(ids, mask, response, entropy=True, entropy_grad=True, packed=packed)
    assert s.entropy is not None
    weights = torch.linspace(-1.0, 1.0, response.numel()).view(response.shape)
    # token-mean, as verl's default loss aggregation
    loss = ((s.logprobs * weights - 0.1 * s.entropy) * response).sum() / response.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return s.logprobs.detach(), s.entropy.detach(), loss.detach(), grads


def _assert_agree(plain, fused):
    (lp0, ent0, loss0, g0), (lp1, ent1, loss1, g1) = plain, fused
    assert torch.allclose(lp1, lp0, atol=TOL, rtol=0), float((lp1 - lp0).abs().max())
    assert torch.allclose(ent1, ent0, atol=TOL, rtol=0), float((ent1 - ent0).abs().max())
    assert abs(float(loss1 - loss0)) <= TOL * max(1.0, abs(float(loss0)))
    assert g0 and g0.keys() == g1.keys()
    for name in g0:
        # float32 sums over tokens and vocabulary: 1e-5 of the tensor's scale (at least 1)
        gap = float((g1[name] - g0[name]).abs().max())
        assert gap <= TOL * max(1.0, float(g0[name].abs().max())), (name, gap)


def _both(model, **kw):
    plain = _score(Scorer(model, temperature=TEMPERATURE), model, **kw)
    # a chunk smaller than the policy tokens, so more than one chunk runs each way
    fused = _score(Scorer(model, temperature=TEMPERATURE, fused=True), model, chunk=7, **kw)
    return plain, fused


@pytest.mark.parametrize("pack", [False, True], ids=["rows", "tree"])
def test_fused_scores_loss_and_gradients_match_the_unfused_path(pack):
    model = tiny_causal_lm(vocab_size=VOCAB, seed=1, init_std=0.2)
    _assert_agree(*_both(model, pack=pack))


def test_fused_agrees_with_lora_on_the_body():
    model = tiny_causal_lm(vocab_size=VOCAB, seed=2, init_std=0.2)
    adapter_format.inject(model, rank=4, alpha=8, target_modules="all-linear")
    with torch.no_grad():  # a trained adapter (peft starts B at zero, a no-op)
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.1)
    plain, fused = _both(model, pack=False)
    _assert_agree(plain, fused)
    assert all(".lora_" in n for n in fused[3])  # only the adapter has gradients


def test_fused_agrees_under_routing_replay():
    model, _ = tiny.tiny_model("qwen3_moe", experts=4, experts_per_token=2, seed=3)
    model = model.float()
    replay = RoutingReplay(model)
    ids, _, _ = _batch()
    gen = torch.Generator().manual_seed(0)
    # forced routing, so the replay changes what the model computes
    experts = torch.stack(
        [
            torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(replay.layers)])
            for _ in range(ids.numel())
        ]
    )
    valid = torch.ones(ids.numel(), dtype=torch.bool)
    plain, fused = _both(model, pack=False, around=lambda: replay.use(experts, valid))
    _assert_agree(plain, fused)
    assert replay.changed > 0


def test_the_temperature_is_applied():
    """The agreement above has teeth: at another temperature the fused scores move far more
    than the tolerance (a fused path that left the temperature out would fail it)."""
    model = tiny_causal_lm(vocab_size=VOCAB, seed=1, init_std=0.2)
    ids, mask, response = _batch()
    with torch.no_grad():
        at = {
            t: Scorer(model, temperature=t, fused=True)(ids, mask, response, entropy=False).logprobs
            for t in (TEMPERATURE, 1.0)
        }
    assert float((at[TEMPERATURE] - at[1.0]).abs().max()) > 1000 * TOL


def _trials():
    out = []
    for i, row in enumerate(ROWS * 2):
        lp = [0.0] * PROMPT + [-1.5] * (len(row) - PROMPT)
        out.append(
            trial(
                f"t{i}",
                f"g{i % 2}",
                [(row, [0] * PROMPT + [1] * (len(row) - PROMPT), lp)],
                float(i % 3 == 0),
            )
        )
    return out


@pytest.mark.parametrize(
    ("lora_rank", "estimator", "checkpointing"),
    [(0, "grpo", False), (4, "grpo", False), (0, "gae", False), (4, "grpo", True)],
    # gae: a no-grad pre-pass with the value head, then the update
    ids=["full", "lora", "gae", "lora-checkpointed"],
)
def test_an_optimizer_step_is_the_same_fused_or_not(lora_rank, estimator, checkpointing):
    algorithm = AlgorithmSection(adv_estimator=estimator, entropy_coeff=0.01, use_kl_loss=True)
    model = tiny_causal_lm(vocab_size=VOCAB, seed=4, init_std=0.2)
    metrics = {}
    for fused in (False, True):
        torch.manual_seed(0)  # the same LoRA / value head initialisation for both
        opt = TorchOptimizer(
            TorchOptimizerConfig(
                lr=1e-3,
                use_fused_kernels=fused,
                lora_rank=lora_rank,
                gradient_checkpointing=checkpointing,
            ),
            algorithm=algorithm,
            temperature=TEMPERATURE,
            model=copy.deepcopy(model),
        )
        assert (opt.scorer.fused is not None) == fused
        assert opt.ref_scorer is not None and (opt.ref_scorer.fused is not None) == fused
        metrics[fused] = opt.step(_trials())
    keys = ["actor/pg_loss", "actor/entropy", "actor/kl_ref", "actor/grad_norm"]
    if estimator == "gae":
        keys += ["critic/vf_loss", "advantages/mean"]
    for key in keys:
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=TOL, abs=TOL), key


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")  # peft, on the tied head
def test_a_lora_adapter_on_the_head_is_refused_naming_the_fix():
    model = tiny_causal_lm(vocab_size=VOCAB, seed=0)
    with pytest.raises(
        ConfigError, match="use_fused_kernels = true .*lm_head.*Set use_fused_kernels = false"
    ):
        TorchOptimizer(
            TorchOptimizerConfig(
                use_fused_kernels=True, lora_rank=2, target_modules=["q_proj", "lm_head"]
            ),
            algorithm=AlgorithmSection(),
            temperature=1.0,
            model=model,
        )


def test_a_head_with_a_bias_is_refused():
    model = tiny_causal_lm(vocab_size=VOCAB, seed=0)
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    model.set_output_embeddings(biased)
    with pytest.raises(ConfigError, match="bias"):
        Scorer(model, temperature=1.0, fused=True)
