"""verl's FSDP engine vs the embedded torch trainer: one GRPO step on the same batch.

Both start from the same weights (SmolLM2-135M by default, fp32, on the CPU; verl with its
``cpu`` platform plugin and gloo, world size 1) and take one step on the same trials; the
table gives each one's policy loss, gradient norm and wall time, and the largest relative
difference of the policy-token log-probs after the update.

    .venv/bin/python bench/verl_vs_torch.py [--model PATH] [--groups 2] [--n 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from slr_optimizer_verl.testing import agreement_trials, compare

from slr.config import AlgorithmSection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--policy-loss", default="vanilla")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from slr_optimizer_torch.model import resolve_model_name

    model = resolve_model_name(args.model)
    trials = agreement_trials(49152, groups=args.groups, n=args.n)
    # verl prints progress to stdout; keep stdout for the table or the one JSON object
    with contextlib.redirect_stdout(sys.stderr):
        out = compare(
            model,
            trials,
            algorithm=AlgorithmSection(adv_estimator="grpo", policy_loss=args.policy_loss),
            temperature=args.temperature,
        )
    out["model"] = args.model
    if args.json:
        print(json.dumps(out))
        return
    print(f"one GRPO step ({args.policy_loss}), {out['policy_tokens']} policy tokens, {args.model}")
    print(f"{'':<22}{'torch':>14}{'verl FSDP':>14}{'rel diff':>12}")
    print(
        f"{'policy loss':<22}{out['torch_loss']:>14.6e}{out['verl_loss']:>14.6e}"
        f"{out['loss_rel']:>12.2e}"
    )
    print(
        f"{'grad norm':<22}{out['torch_grad_norm']:>14.6f}{out['verl_grad_norm']:>14.6f}"
        f"{out['grad_norm_rel']:>12.2e}"
    )
    print(f"{'log-probs after step':<22}{'':>14}{'':>14}{out['logprobs_rel_max']:>12.2e}")
    print(f"{'wall time (s)':<22}{out['torch_s']:>14.1f}{out['verl_s']:>14.1f}")


if __name__ == "__main__":
    main()
