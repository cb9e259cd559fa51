"""Trainer throughput: ``TorchOptimizer.step`` vs a bare forward+backward loop, same run.

Both process the same batch (the same sequences, the same micro-batches by token budget)
on the same model, one AdamW update each; the figure of merit is the ratio of their
tokens/s, so machine load and model size cancel out. ``step`` does more than the bare loop
(batch assembly, verl's advantage estimator and policy loss, entropy, metrics, gradient
clipping) and less (its LM head runs only where a policy token is predicted).

    .venv/bin/python bench/trainer_throughput.py                     # a tiny random model
    .venv/bin/python bench/trainer_throughput.py --model PATH        # e.g. SmolLM2-135M
    .venv/bin/python bench/trainer_throughput.py --json              # one JSON object
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, cast

import harness
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import load_causal_lm
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import tiny_causal_lm, trial

from slr.config import AlgorithmSection

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def make_trials(vocab: int, *, groups: int, n: int, prompt: int, response: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    trials = []
    for k in range(groups):
        prompt_ids = torch.randint(0, vocab, (prompt,), generator=g).tolist()
        for i in range(n):
            length = response - int(torch.randint(0, response // 4 + 1, (1,), generator=g))
            resp = torch.randint(0, vocab, (length,), generator=g).tolist()
            logprobs = (-torch.rand(length, generator=g) * 5).tolist()
            seg = (prompt_ids + resp, [0] * prompt + [1] * length, [0.0] * prompt + logprobs)
            trials.append(trial(f"t{k}-{i}", f"g{k}", [seg], float(i % 2)))
    return trials


def bare_step(
    model, optim, batch: batching.TrainBatch, micro, temperature: float, *, selective: bool
) -> int:
    """The minimal trainer: logits, log-softmax, masked mean, backward, one update.

    ``selective``: the LM head only where a policy token is predicted (as ``step`` does), so
    the difference to ``step`` is its bookkeeping alone.
    """
    optim.zero_grad(set_to_none=True)
    total = batch.num_policy_tokens
    tokens = 0
    for rows in micro:
        length = int(batch.lengths[rows].max())
        ids = batch.input_ids[rows, :length]
        attention = batch.attention_mask[rows, :length]
        mask = batch.response_mask[rows, : length - 1]
        if selective:
            hidden = model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
            logits = model.get_output_embeddings()(hidden[:, :-1][mask > 0])
            logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
            lp = logprobs.gather(-1, ids[:, 1:][mask > 0].unsqueeze(-1)).squeeze(-1)
            loss = -lp.sum() / total
        else:
            logits = model(input_ids=ids, attention_mask=attention).logits
            logprobs = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
            lp = logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            loss = -(lp * mask).sum() / total
        loss.backward()
        tokens += int(batch.lengths[rows].sum())
    optim.step()
    return tokens


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="", help="HF model folder; default: a tiny random model")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=4, help="trials per group")
    parser.add_argument("--prompt-tokens", type=int, default=384)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = harness.Output(args)

    torch.manual_seed(0)
    if args.model:
        model = load_causal_lm(args.model, dtype=torch.float32, device=torch.device("cpu"))
    else:
        # a PreTrainedModel (transformers' AutoModelForCausalLM), typed as a torch Module
        model = cast("PreTrainedModel", tiny_causal_lm(vocab_size=4096, hidden_size=128, layers=4))
    head = model.get_output_embeddings()
    assert isinstance(head, torch.nn.Linear), head
    vocab = int(head.weight.shape[0])
    trials = make_trials(
        vocab,
        groups=args.groups,
        n=args.n,
        prompt=args.prompt_tokens,
        response=args.response_tokens,
        seed=0,
    )
    options = TorchOptimizerConfig(lr=1e-7, micro_batch_tokens=args.micro_batch_tokens)
    opt = TorchOptimizer(options, algorithm=AlgorithmSection(), temperature=1.0, model=model)
    batch = batching.assemble(trials)
    micro = batching.micro_batches(
        range(batch.num_sequences), batch.lengths, max_tokens=args.micro_batch_tokens
    )
    bare_optim = torch.optim.AdamW(model.parameters(), lr=1e-7)

    opt.step(trials)  # warm-up: first-call allocations, lazy imports
    bare_step(model, bare_optim, batch, micro, 1.0, selective=False)
    # Each variant is timed by wall clock and by this process's CPU time: on a shared machine
    # the CPU time is the stable one (work per token), the wall clock what a user waits.
    variants = {
        "step": lambda: (opt.step(trials), batch.stats["batch/tokens"])[1],
        "bare": lambda: bare_step(model, bare_optim, batch, micro, 1.0, selective=False),
        "bare_selective_head": lambda: bare_step(
            model, bare_optim, batch, micro, 1.0, selective=True
        ),
    }
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):  # interleaved, so load changes hit all three alike
        for name, run in variants.items():
            w0, c0 = time.perf_counter(), time.process_time()
            tokens = run()
            wall[name].append(tokens / (time.perf_counter() - w0))
            cpu[name].append(tokens / (time.process_time() - c0))
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    result = {
        "model": args.model or "tiny-random (4 layers, hidden 128, vocab 4096)",
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "sequences": batch.num_sequences,
        "tokens_per_step": batch.stats["batch/tokens"],
        "policy_tokens_per_step": batch.stats["batch/policy_tokens"],
        "micro_batches": len(micro),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "tokens_per_s_wall": {k: round(v, 1) for k, v in med.items()},
        "tokens_per_cpu_s": {k: round(v, 1) for k, v in med_cpu.items()},
        "ratio_step_over_bare_wall": round(med["step"] / med["bare"], 3),
        "ratio_step_over_bare_cpu": round(med_cpu["step"] / med_cpu["bare"], 3),
        "ratio_step_over_bare_selective_head_cpu": round(
            med_cpu["step"] / med_cpu["bare_selective_head"], 3
        ),
    }
    out.table(
        [("variant", "<"), ("tokens/s wall", ".1f"), ("tokens/CPU s", ".1f")],
        [[k, med[k], med_cpu[k]] for k in variants],
        title=f"{result['model']}: {result['sequences']} sequences, "
        f"{result['tokens_per_step']} tokens a step in {result['micro_batches']} micro-batches, "
        f"median of {args.repeats}, torch threads {result['torch_threads']}",
    )
    out.print(
        f"step / bare: wall {result['ratio_step_over_bare_wall']:.3f}, CPU "
        f"{result['ratio_step_over_bare_cpu']:.3f}; step / bare with the selective head: CPU "
        f"{result['ratio_step_over_bare_selective_head_cpu']:.3f}"
    )
    out.result(result)


if __name__ == "__main__":
    main()
