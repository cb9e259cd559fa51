"""GPU checks that need only torch: bf16 rollout vs trainer log-probs, and step times.

What a lent single-GPU machine can run in a few minutes with torch and nothing else
installed (no network, no model download): ``bench/gpu/torch_only.sh`` calls it.

- **Part A (torch only, always)**: a small random causal LM written here in plain torch
  (RMSNorm, rotary-free causal attention through ``scaled_dot_product_attention``, MLP),
  briefly trained on a fixed synthetic token stream so its distributions are not flat.
  The rollout samples completions in bf16 with a KV cache, one token at a time, recording
  ``log_softmax(logits / T)`` of each sampled token; the trainer recomputes them with one
  full forward pass in fp32 and in bf16. Reported: Pearson and max / mean |diff| of the
  per-token log-probs (rollout bf16 vs trainer fp32, and vs trainer bf16), and the
  median time of a training step (forward, backward, AdamW) in bf16 autocast.
- **Part B (when the tree's packages import: transformers, verl, slr's core deps)**:
  ``slr_engine_hf.HfEngine`` on CUDA in bf16 with a tiny random Qwen2 generates; the
  same log-probs from an fp32 forward pass of the same weights; and
  ``slr_optimizer_torch.TorchOptimizer`` GRPO steps on CUDA in bf16 with their times.
  A missing package skips part B with the import error named.

    python bench/gpu/torch_only.py [--device cuda] [--json out.json] [--quick]

Without a GPU it exits with status 2 and says so, unless ``--device cpu`` is given.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # run as bench/gpu/torch_only.py: the harness is one up
import harness  # noqa: E402

# -- part A: a causal LM in plain torch -------------------------------------------------


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = nn.RMSNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            if cache:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        # a single new token attends to everything cached; a full pass is causal
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(context, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, caches: list | None = None, start: int = 0):
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.pos(pos)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return self.head(self.norm(x))


def pearson(a: list[float], b: list[float]) -> float:
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    ta, tb = ta - ta.mean(), tb - tb.mean()
    return float((ta * tb).sum() / (ta.norm() * tb.norm()))


def compare(rollout: list[float], trainer: list[float]) -> dict[str, float]:
    diffs = [abs(x - y) for x, y in zip(rollout, trainer, strict=True)]
    return {
        "pearson": pearson(rollout, trainer),
        "max_abs_diff": max(diffs),
        "mean_abs_diff": sum(diffs) / len(diffs),
    }


def median_ms(fn, device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    return harness.median_timed(fn, repeats=repeats, warmup=1, sync=sync)[1] * 1000


def part_a(device: torch.device, *, quick: bool) -> dict:
    torch.manual_seed(0)
    vocab, hidden, layers, heads, context = 4096, 256, 4, 8, 512
    model = TinyLM(vocab, hidden, layers, heads, context).to(device)
    # a short fit to a fixed random "language" (a repeated pattern), so sampling is peaky
    rows, length = (8, 48) if quick else (64, 128)
    data = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(1))
    data = data.to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(3 if quick else 120):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), data[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.eval()

    rollout_model = TinyLM(vocab, hidden, layers, heads, context).to(device).to(torch.bfloat16)
    rollout_model.load_state_dict(model.state_dict())
    rollout_model.eval()
    temperature, n, prompt_len, new = (
        1.0,
        4 if quick else 64,
        16 if quick else 32,
        8 if quick else 192,
    )
    prompts = data[:n, :prompt_len]
    gen = torch.Generator(device=device).manual_seed(2)
    with torch.no_grad():
        caches = [[] for _ in range(layers)]
        logits = rollout_model(prompts, caches)[:, -1]
        tokens, lps = [], []
        for step in range(new):
            lp = torch.log_softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(lp.exp(), 1, generator=gen)
            tokens.append(nxt)
            lps.append(lp.gather(-1, nxt))
            logits = rollout_model(nxt, caches, start=prompt_len + step)[:, -1]
        tokens_t = torch.cat(tokens, dim=1)
        rollout_lp = torch.cat(lps, dim=1).flatten().tolist()
        full = torch.cat([prompts, tokens_t], dim=1)

        def trainer_lp(m: nn.Module) -> list[float]:
            out = m(full)[:, prompt_len - 1 : -1].float() / temperature
            return torch.log_softmax(out, -1).gather(-1, tokens_t.unsqueeze(-1)).flatten().tolist()

        fp32 = trainer_lp(model)
        bf16 = trainer_lp(rollout_model)

    model.train()
    batch = data[: 4 if quick else 16]

    def train_step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), batch[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()

    step_ms = median_ms(train_step, device, 2 if quick else 20)
    return {
        "tokens_compared": len(rollout_lp),
        "rollout_bf16_vs_trainer_fp32": compare(rollout_lp, fp32),
        "rollout_bf16_vs_trainer_bf16": compare(rollout_lp, bf16),
        "train_step_ms_bf16": step_ms,
        "train_tokens_per_s": batch[:, :-1].numel() / (step_ms / 1000),
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }


# -- part B: the project's hf engine and torch optimizer --------------------------------


def _tree_on_path() -> None:
    for src in ("core/src", "plugins/engine-hf/src", "plugins/optimizer-torch/src"):
        sys.path.insert(0, str(ROOT / src))


class _IdsOnlyTokenizer:
    """Enough tokenizer for the engine on token ids (no tokenizer files, no download)."""

    eos_token_id = 0
    pad_token_id = 0
    bos_token_id = None

    def decode(self, ids, **_: object) -> str:
        return " ".join(str(i) for i in ids)

    def __len__(self) -> int:
        return 4096


def part_b(device: torch.device, *, quick: bool) -> dict:
    _tree_on_path()
    try:
        import asyncio

        from slr_engine_hf.config import HfEngineConfig
        from slr_engine_hf.engine import HfEngine
        from transformers import AutoModelForCausalLM, Qwen2Config

        from slr.contracts import SamplingParams
    except ImportError as exc:
        return {"skipped": f"the hf engine does not import here: {exc}"}
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    fp32 = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).eval()
    bf16 = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()
    bf16.load_state_dict(fp32.state_dict())
    engine = HfEngine.from_model(bf16, _IdsOnlyTokenizer(), HfEngineConfig(device=str(device)))
    prompts = [[(7 * i + j) % 4000 + 1 for j in range(32)] for i in range(4 if quick else 8)]
    params = SamplingParams(max_tokens=8 if quick else 96, temperature=1.0, seed=3)

    async def rollout():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    t0 = time.perf_counter()
    gens = asyncio.run(rollout())
    gen_s = time.perf_counter() - t0
    asyncio.run(engine.close())
    engine_lp, trainer_lp = [], []
    with torch.no_grad():
        for p, g in zip(prompts, gens, strict=True):
            ids = torch.tensor([p + list(g.token_ids)], device=device)
            lp = torch.log_softmax(fp32(input_ids=ids).logits[0].float(), -1)
            trainer_lp += [float(lp[len(p) - 1 + i, t]) for i, t in enumerate(g.token_ids)]
            engine_lp += list(g.logprobs)
    out: dict = {
        "engine_tokens": len(engine_lp),
        "engine_tokens_per_s": len(engine_lp) / gen_s,
        "engine_bf16_vs_trainer_fp32": compare(engine_lp, trainer_lp),
    }
    try:
        from slr_optimizer_torch.config import TorchOptimizerConfig
        from slr_optimizer_torch.optimizer import TorchOptimizer
        from slr_optimizer_torch.testing import trial

        from slr.config import AlgorithmSection
    except ImportError as exc:
        out["optimizer"] = {"skipped": f"the torch optimizer does not import here: {exc}"}
        return out
    options = TorchOptimizerConfig(device=str(device), dtype="bfloat16", lr=1e-5)
    optimizer = TorchOptimizer(
        options, algorithm=AlgorithmSection(), temperature=1.0, model=fp32.to(torch.bfloat16)
    )
    trials = []
    for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
        seg = (
            p + list(g.token_ids),
            [0] * len(p) + [1] * len(g.token_ids),
            [0.0] * len(p) + list(g.logprobs),
        )
        trials.append(trial(f"t{i}", f"g{i // 4}", [seg], float(i % 2)))
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    runs = [
        harness.timed(lambda: optimizer.step(trials), sync=sync) for _ in range(2 if quick else 5)
    ]
    metrics = runs[-1][0]
    times = [s * 1000 for _, s in runs]
    out["optimizer"] = {
        "step_ms_median": statistics.median(times),
        "first_step_ms": times[0],
        "loss": float(metrics.get("actor/pg_loss", math.nan)),
    }
    return out


def main() -> int:
    parser = harness.parser(__doc__, json_path=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a dry run of the code (e.g. on a CPU)"
    )
    parser.add_argument("--skip-b", action="store_true", help="torch only: skip part B")
    args = parser.parse_args()
    out = harness.Output(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "torch_only.py: no CUDA device is visible to torch (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); run it on the GPU "
            "machine, or pass --device cpu for a dry run",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    results: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    results["part_a"] = part_a(device, quick=args.quick)
    results["part_b"] = {"skipped": "--skip-b"} if args.skip_b else part_b(device, quick=args.quick)
    a = results["part_a"]
    rows = [
        ("A rollout bf16 vs trainer fp32", a["rollout_bf16_vs_trainer_fp32"]),
        ("A rollout bf16 vs trainer bf16", a["rollout_bf16_vs_trainer_bf16"]),
    ]
    if "engine_bf16_vs_trainer_fp32" in results["part_b"]:
        rows.append(
            ("B hf engine bf16 vs trainer fp32", results["part_b"]["engine_bf16_vs_trainer_fp32"])
        )
    out.table(
        [("check", "<"), ("pearson", ".6f"), ("max|diff|", ".4f"), ("mean|diff|", ".5f")],
        [[name, m["pearson"], m["max_abs_diff"], m["mean_abs_diff"]] for name, m in rows],
        title=f"device: {results['device']}  torch {results['torch']}",
    )
    out.print(
        f"A train step (bf16 autocast): {a['train_step_ms_bf16']:.1f} ms, "
        f"{a['train_tokens_per_s']:.0f} tokens/s"
    )
    out.print(f"B: {json.dumps(results['part_b'])}")
    out.result(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
