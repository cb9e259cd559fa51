"""The agreement check behind the test and bench/verl_vs_torch.py: one batch, both trainers.

``compare`` runs one step of ``slr-optimizer-torch`` and one of this optimizer on the same
trials from the same weights and returns the loss, gradient norm and log-probs after the
update of each, with their relative differences. ``agreement_trials`` builds a small batch
with what agent trajectories have: groups with mixed rewards, a multi-turn segment whose
tool output is masked out of the loss, rows of different lengths.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from slr.config import AlgorithmSection
from slr.contracts import TrialResult


def agreement_trials(
    vocab: int, *, seed: int = 0, groups: int = 2, n: int = 3
) -> list[TrialResult]:
    from slr_optimizer_torch.testing import trial

    g = torch.Generator().manual_seed(seed)

    def ids(k: int) -> list[int]:
        return torch.randint(10, vocab, (k,), generator=g).tolist()

    trials = []
    for k in range(groups):
        prompt = ids(12 + 3 * k)
        for i in range(n):
            first, tool, second = ids(6 + i), ids(4), ids(5 + 2 * i)
            tokens = prompt + first + tool + second
            mask = [0] * len(prompt) + [1] * len(first) + [0] * len(tool) + [1] * len(second)
            logprobs = [0.0 if m == 0 else -1.5 for m in mask]
            trials.append(trial(f"t{k}-{i}", f"g{k}", [(tokens, mask, logprobs)], float(i == k)))
    return trials


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def compare(
    model_path: str,
    trials: list[TrialResult],
    *,
    algorithm: AlgorithmSection | None = None,
    temperature: float = 1.0,
    lr: float = 1e-5,
) -> dict[str, Any]:
    """One step of each trainer on ``trials``; their figures and relative differences."""
    from slr_optimizer_torch import batch as batching
    from slr_optimizer_torch.config import TorchOptimizerConfig
    from slr_optimizer_torch.optimizer import TorchOptimizer

    from slr_optimizer_verl.config import VerlOptimizerConfig
    from slr_optimizer_verl.optimizer import VerlOptimizer

    algorithm = algorithm or AlgorithmSection()
    out: dict[str, Any] = {}

    t0 = time.perf_counter()
    torch_opt = TorchOptimizer(
        TorchOptimizerConfig(model=model_path, lr=lr, dtype="float32", device="cpu", pack="none"),
        algorithm=algorithm,
        temperature=temperature,
    )
    torch_metrics = torch_opt.step(trials)
    tb = batching.assemble(trials)
    torch_after = torch_opt._score_all(tb, torch_opt.scorer).logprobs
    out["torch_s"] = time.perf_counter() - t0
    del torch_opt

    t0 = time.perf_counter()
    verl_opt = VerlOptimizer(
        VerlOptimizerConfig(model=model_path, lr=lr, dtype="float32", device="cpu"),
        algorithm=algorithm,
        temperature=temperature,
    )
    try:
        verl_metrics = verl_opt.step(trials)
        verl_after = verl_opt.logprobs(tb)
    finally:
        verl_opt.close()
    out["verl_s"] = time.perf_counter() - t0

    mask = tb.response_mask > 0
    a, b = torch_after[mask].double(), verl_after[mask].double()
    out.update(
        {
            "policy_tokens": int(mask.sum()),
            "torch_loss": torch_metrics["actor/pg_loss"],
            "verl_loss": verl_metrics["actor/pg_loss"],
            "torch_grad_norm": torch_metrics["actor/grad_norm"],
            "verl_grad_norm": verl_metrics["actor/grad_norm"],
            "loss_rel": _rel(torch_metrics["actor/pg_loss"], verl_metrics["actor/pg_loss"]),
            "grad_norm_rel": _rel(
                torch_metrics["actor/grad_norm"], verl_metrics["actor/grad_norm"]
            ),
            "logprobs_rel_max": float(((a - b).abs() / a.abs().clamp(min=1e-12)).max()),
            "logprobs_abs_max": float((a - b).abs().max()),
        }
    )
    return out
