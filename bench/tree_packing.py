"""Training on the tree vs on copies: tokens computed per update and step time, same run.

A long agent session, built as the proxy records it: one group of ``--trials`` sessions of
``--turns`` turns each, rendered with SmolLM2's ChatML template and tokenized by its tokenizer
(real token ids), with compactions (a ``rewrite`` segment: the system prompt, a summary,
then the conversation goes on) and sub-agents (a ``fork`` segment: the main conversation's
prefix, then the sub-agent's own turns). ``TorchOptimizer.step`` runs on the same trials with
``[optimizer] pack = "none"`` (every segment recomputes its prefix) and ``"tree"`` (shared
prefixes once), interleaved, on the same model.

    .venv/bin/python bench/tree_packing.py                 # tiny random model, SmolLM2 vocab
    .venv/bin/python bench/tree_packing.py --model smollm2-135m-instruct --json

"tokens/update" is what the update's forward computed (``update/tokens``); "unique" is the
size of the batch's prefix tree (``batch/unique_tokens``), the least any forward can compute.
The tree's attention runs dense over each packed micro-batch (a 4-D mask), so "attn pairs"
(query-key pairs scored per update) is reported beside the tokens: it is what grows when one
packed tree gets long.
"""

from __future__ import annotations

import copy
import random
import statistics
import time

import harness
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch import packing
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import load_causal_lm
from slr_optimizer_torch.optimizer import TorchOptimizer

from slr.config import AlgorithmSection
from slr.contracts import Reward, Segment, Trajectory, TrialResult

WORDS = (
    "the file test function error import module class value return list path config "
    "patch diff line assert raise call check build run fix update parse token index "
    "repository commit branch merge docs output input result status failed passed"
).split()


class Chat:
    """One conversation's ids as the proxy records them: ChatML, policy replies mask 1."""

    def __init__(self, tok, ids=(), mask=(), logprobs=()) -> None:
        self.tok = tok
        self.ids, self.mask, self.logprobs = list(ids), list(mask), list(logprobs)

    def copy(self) -> Chat:
        return Chat(self.tok, self.ids, self.mask, self.logprobs)

    def _add(self, text: str, policy: bool, rng: random.Random) -> None:
        ids = self.tok.encode(text, add_special_tokens=False)
        self.ids += ids
        self.mask += [int(policy)] * len(ids)
        self.logprobs += [-rng.random() * 3 if policy else 0.0 for _ in ids]

    def message(self, role: str, content: str, rng: random.Random) -> None:
        self._add(f"<|im_start|>{role}\n{content}<|im_end|>\n", False, rng)

    def reply(self, content: str, rng: random.Random) -> None:
        self._add("<|im_start|>assistant\n", False, rng)
        self._add(f"{content}<|im_end|>", True, rng)
        self._add("\n", False, rng)

    def segment(self, **lineage) -> Segment:
        return Segment(token_ids=self.ids, loss_mask=self.mask, logprobs=self.logprobs, **lineage)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def session(tok, *, seed: int, system: Chat, turns: int, branches: int, sub_turns: int):
    """``turns`` main turns; ``branches`` events spread evenly, compactions and sub-agents
    alternating (a compaction first)."""
    rng = random.Random(seed)
    main = system.copy()
    main.message("user", "Fix the failing test. " + text(rng, 40), rng)
    segments: list[Segment] = []
    current = 0  # index of the main conversation's segment to be
    lineage: dict = {}
    every = max(1, turns // (branches + 1))
    events = {
        every * (k + 1): ("compaction" if k % 2 == 0 else "subagent") for k in range(branches)
    }
    pending_forks: list[tuple[Chat, int]] = []
    for turn in range(1, turns + 1):
        main.reply(f'{{"tool": "bash", "command": "{text(rng, 12)}"}}', rng)
        main.message("tool", text(rng, rng.randint(20, 60)), rng)
        kind = events.get(turn)
        if kind == "subagent":
            sub = main.copy()
            fork_at = len(sub.ids)
            sub.message("user", "Sub-task: " + text(rng, 20), rng)
            for _ in range(sub_turns):
                sub.reply(f'{{"tool": "read", "path": "{text(rng, 3)}"}}', rng)
                sub.message("tool", text(rng, rng.randint(20, 60)), rng)
            sub.reply("Done: " + text(rng, 15), rng)
            pending_forks.append((sub, fork_at))
        elif kind == "compaction":
            segments.append(main.segment(**lineage))
            parent = len(segments) - 1
            for sub, fork_at in pending_forks:  # recorded after their parent
                segments.append(sub.segment(parent=parent, branch_at=fork_at, branch="fork"))
            pending_forks = []
            main = system.copy()
            main.message("user", "Summary of the work so far: " + text(rng, 60), rng)
            lineage = {"parent": current, "branch_at": len(system.ids), "branch": "rewrite"}
            current = len(segments)
    segments.append(main.segment(**lineage))
    parent = len(segments) - 1
    for sub, fork_at in pending_forks:
        segments.append(sub.segment(parent=parent, branch_at=fork_at, branch="fork"))
    return segments


def make_trials(tok, args) -> list[TrialResult]:
    rng = random.Random(0)
    system = Chat(tok)
    system.message("system", "You are a coding agent. Tools: " + text(rng, args.system_words), rng)
    trials = []
    for i in range(args.trials):
        segments = session(
            tok,
            seed=i + 1,
            system=system,
            turns=args.turns,
            branches=args.branches,
            sub_turns=args.sub_turns,
        )
        trials.append(
            TrialResult(
                trial_id=f"s{i}",
                task_id="task",
                group_id="g",
                termination="completed",
                reward=Reward(value=float(i % 2)),
                trajectory=Trajectory(session_id=f"s{i}", segments=segments),
            )
        )
    return trials


def attention_pairs(opt: TorchOptimizer, tb: batching.TrainBatch) -> int:
    """Query-key pairs the update's attention scores (padding and masked pairs included)."""
    rows = list(range(tb.num_sequences))
    total = 0
    for micro, packed in opt._micro(tb, rows):
        if packed is not None:
            total += packed.tokens**2
        else:
            total += len(micro) * int(tb.lengths[micro].max()) ** 2
    return total


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="", help="model to train; default: tiny random Llama")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct")
    parser.add_argument("--trials", type=int, default=2, help="sessions in the group")
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--branches", type=int, default=5, help="compactions + sub-agents")
    parser.add_argument("--sub-turns", type=int, default=4, help="turns of each sub-agent")
    parser.add_argument("--system-words", type=int, default=400)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    report = harness.Output(args)

    from slr_engine_hf.models import ensure_tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ensure_tokenizer(args.tokenizer)))
    trials = make_trials(tok, args)
    if args.model:
        model = load_causal_lm(args.model, dtype=torch.float32, device=torch.device("cpu"))
    else:
        from transformers import AutoModelForCausalLM, LlamaConfig

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(
            LlamaConfig(
                vocab_size=len(tok),
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=32768,
                tie_word_embeddings=True,
            )
        ).eval()

    opts = {}
    for mode in ("none", "tree"):
        opts[mode] = TorchOptimizer(
            TorchOptimizerConfig(
                lr=1e-6, pack=mode, micro_batch_tokens=args.micro_batch_tokens, clip_grad=0.0
            ),
            algorithm=AlgorithmSection(),
            temperature=1.0,
            model=copy.deepcopy(model),
        )
    tb = batching.assemble(trials)
    rows = list(range(tb.num_sequences))
    unique = packing.unique_tokens(rows, tb.input_ids, tb.lengths)
    runs: dict[str, list[dict]] = {"none": [], "tree": []}
    for _ in range(args.repeats):
        for mode, opt in opts.items():
            cpu = time.process_time()
            metrics = opt.step(trials)
            metrics["cpu_s"] = time.process_time() - cpu
            runs[mode].append(metrics)

    segs = [len(t.trajectory.segments) for t in trials if t.trajectory is not None]
    out: dict = {
        "sessions": len(trials),
        "turns": args.turns,
        "segments": sum(segs),
        "forks": sum(t.trajectory.num_forks for t in trials if t.trajectory is not None),
        "rewrites": sum(t.trajectory.num_rewrites for t in trials if t.trajectory is not None),
        "policy_tokens": tb.num_policy_tokens,
        "unique_tokens": unique,
        "model": args.model or "tiny-random-llama",
    }
    for mode, label in (("none", "copies"), ("tree", "tree")):
        ms = runs[mode]
        step_s = statistics.median(m["perf/step_s"] for m in ms)
        cpu_s = statistics.median(m["cpu_s"] for m in ms)
        tokens = int(ms[0]["update/tokens"])
        out[label] = {
            "tokens_per_update": tokens,
            "over_unique": tokens / unique,
            "attention_pairs": attention_pairs(opts[mode], tb),
            "step_s": step_s,
            "step_cpu_s": cpu_s,
            "micro_batches": int(ms[0]["update/micro_batches"]),
        }
    out["tokens_copies_over_tree"] = (
        out["copies"]["tokens_per_update"] / out["tree"]["tokens_per_update"]
    )
    out["step_speedup"] = out["copies"]["step_s"] / out["tree"]["step_s"]
    out["step_cpu_speedup"] = out["copies"]["step_cpu_s"] / out["tree"]["step_cpu_s"]
    out["goal_met"] = out["tree"]["over_unique"] <= 1.5

    report.table(
        [
            ("layout", "<"),
            "tokens/update",
            ("x unique", ".2f"),
            ("attn pairs", ".3g"),
            "micro-batches",
            ("step s", ".2f"),
            ("step CPU s", ".2f"),
        ],
        [
            [
                label,
                r["tokens_per_update"],
                r["over_unique"],
                r["attention_pairs"],
                r["micro_batches"],
                r["step_s"],
                r["step_cpu_s"],
            ]
            for label, r in ((label, out[label]) for label in ("copies", "tree"))
        ],
        title=f"{out['sessions']} sessions x {args.turns} turns, {out['segments']} segments "
        f"({out['rewrites']} rewrites, {out['forks']} forks), {out['unique_tokens']} unique "
        f"tokens, {out['policy_tokens']} policy tokens, model {out['model']}",
    )
    report.print(
        f"copies / tree: {out['tokens_copies_over_tree']:.2f}x tokens, "
        f"{out['step_speedup']:.2f}x step time ({out['step_cpu_speedup']:.2f}x CPU time); "
        f"goal (tree <= 1.5x unique): {out['goal_met']}"
    )
    report.result(out)


if __name__ == "__main__":
    main()
