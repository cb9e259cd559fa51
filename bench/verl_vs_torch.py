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

import contextlib
import sys

import harness
from slr_optimizer_verl.testing import agreement_trials, compare

from slr.config import AlgorithmSection


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--policy-loss", default="vanilla")
    parser.add_argument("--trials", type=int, default=0, help="keep the first K trials (0: all)")
    parser.add_argument("--world-sizes", default="1", help="verl world sizes, e.g. 1,2")
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
    report = harness.Output(args)
    print_table(out, report)
    report.result(out)


def print_table(out: dict, report: harness.Output) -> None:
    """``compare``'s figures (with ``model``, ``trials``, ``policy_loss``) as a table."""
    world_sizes = sorted(int(key[2:]) for key in out if key.startswith("ws"))
    runs = [f"ws{w}" for w in world_sizes]
    names = ["torch", "verl ws1"] + [f"verl {r}" for r in runs]
    losses = [out["torch_loss"], out["verl_loss"]] + [out[r]["loss"] for r in runs]
    norms = [out["torch_grad_norm"], out["verl_grad_norm"]] + [out[r]["grad_norm"] for r in runs]
    secs = [out["torch_s"], out["verl_s"]] + [out[r]["s"] for r in runs]
    report.table(
        ["", *((n, ">") for n in names)],
        [
            ["policy loss", *(f"{v:.6e}" for v in losses)],
            ["grad norm", *(f"{v:.6f}" for v in norms)],
            ["wall time (s)", *(f"{v:.1f}" for v in secs)],
        ],
        title=f"one GRPO step ({out['policy_loss']}), {out['trials']} trials, "
        f"{out['policy_tokens']} policy tokens, {out['model']}",
    )
    diffs = [("ws1 vs torch", out)] + [
        (f"ws{w} vs {other}", out[f"ws{w}"][f"vs_{other}"])
        for w in world_sizes
        for other in ("torch", "ws1")
    ]
    report.table(
        ["", ("loss", ".2e"), ("grad norm", ".2e"), ("log-probs", ".2e")],
        [[n, d["loss_rel"], d["grad_norm_rel"], d["logprobs_rel_max"]] for n, d in diffs],
        title="relative difference vs torch (and vs verl ws1)",
    )


if __name__ == "__main__":
    main()
