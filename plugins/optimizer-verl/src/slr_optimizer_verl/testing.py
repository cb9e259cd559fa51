"""The agreement check behind the test and bench/verl_vs_torch.py: one batch, both trainers.

``compare`` runs one step of ``slr-optimizer-torch`` and one of this optimizer on the same
trials from the same weights and returns the loss, gradient norm and log-probs after the
update of each, with their relative differences. ``agreement_trials`` builds a small batch
with what agent trajectories have: groups with mixed rewards, a multi-turn segment whose
tool output is masked out of the loss, rows of different lengths.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
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


def near_policy(
    model_path: str, trials: list[TrialResult], *, temperature: float, noise: float, seed: int = 0
) -> list[TrialResult]:
    """``trials`` with behaviour log-probs near the model's own: its log-prob of each policy
    token (``log_softmax(logits / temperature)``) plus Gaussian ``noise``, as an engine a
    little off the trainer would record, so off-policy correction weighs and rejects some
    tokens and not others."""
    import attrs
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in trials:
        assert t.trajectory is not None
        segments = []
        for seg in t.trajectory.segments:
            ids = torch.tensor([list(seg.token_ids)])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1].float() / temperature
            own = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
            own = own + noise * torch.randn(own.shape, generator=g)
            mask = torch.tensor(seg.loss_mask[1:], dtype=torch.float32)
            logprobs = [0.0, *(own * mask).tolist()]
            segments.append(attrs.evolve(seg, logprobs=logprobs))
        out.append(attrs.evolve(t, trajectory=attrs.evolve(t.trajectory, segments=segments)))
    return out


def rel(a: float, b: float) -> float:
    """The relative difference of two figures (0 when both are 0)."""
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def critic_folder(model_path: str, folder: Path, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A value model for verl's critic, written to ``folder``: the policy's trunk and a
    seeded value head (``score``, one label), as verl loads a critic from the policy's
    folder, but with a head known in advance. Returns the head's ``weight`` and ``bias`` so
    the torch optimizer's value head can start from the same one."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(model_path)
    config.num_labels = 1
    model = AutoModelForTokenClassification.from_pretrained(
        model_path, config=config, dtype=torch.float32
    )
    g = torch.Generator().manual_seed(seed)
    head = model.get_submodule("score")
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.3)
        head.bias.copy_(torch.randn(head.bias.shape, generator=g) * 0.3)
    model.save_pretrained(folder, safe_serialization=True)
    return {"weight": head.weight.detach().clone(), "bias": head.bias.detach().clone()}


def _versus(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Relative differences of two runs' loss, gradient norm and log-probs after the step."""
    a, b = theirs["after"], mine["after"]
    return {
        "loss_rel": rel(theirs["loss"], mine["loss"]),
        "grad_norm_rel": rel(theirs["grad_norm"], mine["grad_norm"]),
        "logprobs_rel_max": float(((a - b).abs() / a.abs().clamp(min=1e-12)).max()),
        "logprobs_abs_max": float((a - b).abs().max()),
    }


def compare(
    model_path: str,
    trials: list[TrialResult],
    *,
    algorithm: AlgorithmSection | None = None,
    temperature: float = 1.0,
    lr: float = 1e-5,
    steps: int = 1,
    torch_options: Mapping[str, Any] | None = None,
    verl_options: Mapping[str, Any] | None = None,
    value_head: Mapping[str, torch.Tensor] | None = None,
    world_sizes: Sequence[int] = (1,),
) -> dict[str, Any]:
    """``steps`` steps of the torch trainer and of this optimizer at each of ``world_sizes``
    on ``trials``: the last step's figures and their relative differences.

    World size 1's figures are ``verl_loss``, ``verl_grad_norm``, ``loss_rel`` (vs torch),
    ..., and each trainer's metrics (``torch``, ``verl``); each other world size N has
    ``wsN`` with its ``loss``, ``grad_norm``, ``s`` and ``vs_torch`` / ``vs_ws1`` (the same
    differences against torch and world size 1). ``torch_options`` / ``verl_options`` are
    further options of each; ``value_head`` (gae, from ``critic_folder``) is copied into the
    torch optimizer's value head.
    """
    from slr_optimizer_torch import batch as batching
    from slr_optimizer_torch.config import TorchOptimizerConfig
    from slr_optimizer_torch.optimizer import TorchOptimizer

    from slr_optimizer_verl.config import VerlOptimizerConfig
    from slr_optimizer_verl.optimizer import VerlOptimizer

    algorithm = algorithm or AlgorithmSection()
    tb = batching.assemble(trials)
    mask = tb.response_mask > 0
    runs: dict[str, dict[str, Any]] = {}

    t0 = time.perf_counter()
    torch_opt = TorchOptimizer(
        TorchOptimizerConfig(
            model=model_path,
            lr=lr,
            dtype="float32",
            device="cpu",
            pack="none",
            **dict(torch_options or {}),
        ),
        algorithm=algorithm,
        temperature=temperature,
    )
    if value_head is not None:
        assert torch_opt.value_head is not None, "value_head is for gae"
        with torch.no_grad():
            torch_opt.value_head.linear.weight.copy_(value_head["weight"])
            torch_opt.value_head.linear.bias.copy_(value_head["bias"])
    metrics = [torch_opt.step(trials) for _ in range(steps)][-1]
    after = torch_opt._score_all(tb, torch_opt.scorer).logprobs
    del torch_opt
    runs["torch"] = {
        "loss": metrics["actor/pg_loss"],
        "grad_norm": metrics["actor/grad_norm"],
        "after": after[mask].double(),
        "s": time.perf_counter() - t0,
        "metrics": metrics,
    }

    for world_size in world_sizes:
        t0 = time.perf_counter()
        verl_opt = VerlOptimizer(
            VerlOptimizerConfig(
                model=model_path,
                lr=lr,
                dtype="float32",
                device="cpu",
                world_size=world_size,
                **dict(verl_options or {}),
            ),
            algorithm=algorithm,
            temperature=temperature,
        )
        try:
            metrics = [verl_opt.step(trials) for _ in range(steps)][-1]
            after = verl_opt.logprobs(tb)
        finally:
            verl_opt.close()
        runs[f"ws{world_size}"] = {
            "loss": metrics["actor/pg_loss"],
            "grad_norm": metrics["actor/grad_norm"],
            "after": after[mask].double(),
            "s": time.perf_counter() - t0,
            "metrics": metrics,
        }

    torch_run = runs["torch"]
    out: dict[str, Any] = {
        "policy_tokens": int(mask.sum()),
        "torch_loss": torch_run["loss"],
        "torch_grad_norm": torch_run["grad_norm"],
        "torch_s": torch_run["s"],
        "torch": torch_run["metrics"],
    }
    for world_size in world_sizes:
        run = runs[f"ws{world_size}"]
        if world_size == 1:
            out.update(
                {
                    "verl_loss": run["loss"],
                    "verl_grad_norm": run["grad_norm"],
                    "verl_s": run["s"],
                    "verl": run["metrics"],
                    **_versus(run, torch_run),
                }
            )
            continue
        out[f"ws{world_size}"] = {
            "loss": run["loss"],
            "grad_norm": run["grad_norm"],
            "s": run["s"],
            "vs_torch": _versus(run, torch_run),
            **({"vs_ws1": _versus(run, runs["ws1"])} if "ws1" in runs else {}),
        }
    return out
