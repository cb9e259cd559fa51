"""verl's FSDP engine vs the embedded torch trainer: one GRPO step on the same batch.

Both start from the same weights (SmolLM2-135M by default, fp32, on the CPU; verl with its
``cpu`` platform plugin and gloo) and take one step on the same trials; the table gives each
one's policy loss, gradient norm and wall time, and the largest relative difference of the
policy-token log-probs after the update. ``--world-sizes 1,2`` runs verl at world size 1
(in this process) and 2 (two Ray actors, FSDP over them), side by side in the same run.

    .venv/bin/python bench/verl_vs_torch.py [--model PATH] [--groups 2] [--n 3]
        [--trials K] [--world-sizes 1,2] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from slr_optimizer_verl.testing import agreement_trials, compare

from slr.config import AlgorithmSection


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--policy-loss", default="vanilla")
    parser.add_argument("--trials", type=int, default=0, help="keep the first K trials (0: all)")
    parser.add_argument("--world-sizes", default="1", help="verl world sizes, e.g. 1,2")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from slr_optimizer_torch.model import resolve_model_name

    model = resolve_model_name(args.model)
    trials = agreement_trials(49152, groups=args.groups, n=args.n)
    if args.trials:
        trials = trials[: args.trials]
    world_sizes = tuple(int(w) for w in args.world_sizes.split(","))
    if 1 not in world_sizes:
        world_sizes = (1, *world_sizes)
    # verl prints progress to stdout; keep stdout for the table or the one JSON object
    with contextlib.redirect_stdout(sys.stderr):
        out = compare(
            model,
            trials,
            algorithm=AlgorithmSection(adv_estimator="grpo", policy_loss=args.policy_loss),
            temperature=args.temperature,
            world_sizes=world_sizes,
        )
    out["model"] = args.model
    out["trials"] = len(trials)
    out["policy_loss"] = args.policy_loss
    if args.json:
        print(json.dumps(out))
        return
    print_table(out)


def print_table(out: dict) -> None:
    """``compare``'s figures (with ``model``, ``trials``, ``policy_loss``) as a table."""
    world_sizes = sorted(int(key[2:]) for key in out if key.startswith("ws"))
    columns: list[tuple[str, Any]] = [("torch", None), ("verl ws1", None)]
    columns += [(f"verl ws{w}", out[f"ws{w}"]) for w in world_sizes]
    print(
        f"one GRPO step ({out['policy_loss']}), {out['trials']} trials, "
        f"{out['policy_tokens']} policy tokens, {out['model']}"
    )
    print(f"{'':<24}" + "".join(f"{name:>14}" for name, _ in columns))
    losses = [out["torch_loss"], out["verl_loss"]] + [r["loss"] for _, r in columns[2:]]
    norms = [out["torch_grad_norm"], out["verl_grad_norm"]]
    norms += [r["grad_norm"] for _, r in columns[2:]]
    secs = [out["torch_s"], out["verl_s"]] + [r["s"] for _, r in columns[2:]]
    print(f"{'policy loss':<24}" + "".join(f"{v:>14.6e}" for v in losses))
    print(f"{'grad norm':<24}" + "".join(f"{v:>14.6f}" for v in norms))
    print(f"{'wall time (s)':<24}" + "".join(f"{v:>14.1f}" for v in secs))
    print("relative difference vs torch (and vs verl ws1)")
    rows = [("ws1 vs torch", out)] + [
        (f"ws{w} vs {other}", out[f"ws{w}"][f"vs_{other}"])
        for w in world_sizes
        for other in ("torch", "ws1")
    ]
    print(f"{'':<24}{'loss':>12}{'grad norm':>12}{'log-probs':>12}")
    for name, diff in rows:
        print(
            f"{name:<24}{diff['loss_rel']:>12.2e}{diff['grad_norm_rel']:>12.2e}"
            f"{diff['logprobs_rel_max']:>12.2e}"
        )


if __name__ == "__main__":
    main()
