"""The shared-prefix cache on an accelerator: exactness and prefill time, model-free of slr.

    python bench/prefix_cache_gpu.py [--device cuda] [--json]

Imports only torch, transformers and the hf engine's ``batch`` / ``prefix_cache`` modules,
so it runs where slr itself is not installed. A
random model of SmolLM2-135M's shape: one session's 4k-token prompt is prefilled and
cached; a second session with the same 4k prefix and its own 64 tokens is prefilled from
the cache and without it. Reports the largest log-prob difference between the two (fp32),
and the prefill times side by side.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import harness
import torch
from transformers import AutoModelForCausalLM, Qwen2Config


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--prefix", type=int, default=4096)
    p.add_argument("--own", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="median of this many runs")
    args = p.parse_args()
    report = harness.Output(args)
    # the two modules alone, without the package's plugin registration (which needs slr)
    pkg = types.ModuleType("slr_engine_hf")
    pkg.__path__ = [
        str(Path(__file__).resolve().parents[1] / "plugins/engine-hf/src/slr_engine_hf")
    ]
    sys.modules.setdefault("slr_engine_hf", pkg)
    from slr_engine_hf.prefill import prefill
    from slr_engine_hf.prefix_cache import RadixPrefixCache

    config = Qwen2Config(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(args.device).eval()
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 49152, (args.prefix,), generator=g).tolist()
    a = shared + torch.randint(0, 49152, (args.own,), generator=g).tolist()
    b = shared + torch.randint(0, 49152, (args.own,), generator=g).tolist()

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else None

    cache = RadixPrefixCache(max_tokens=3 * args.prefix)
    prefill(model, a[:64], None, 0)  # warm-up

    (_, kv, _), full_s = harness.median_timed(
        lambda: prefill(model, a, None, 0), repeats=args.repeats, sync=sync
    )
    cache.insert(a, kv)

    def from_cache():
        prefix, n, _ = cache.match(b)
        return prefill(model, b, prefix, n, every_position=True), n

    ((cached_logits, _, _), n), cached_s = harness.median_timed(
        from_cache, repeats=args.repeats, sync=sync
    )
    full_logits, _, _ = prefill(model, b, None, 0, every_position=True)
    lp_cached = torch.log_softmax(cached_logits.float(), -1)
    lp_full = torch.log_softmax(full_logits[n:].float(), -1)
    tokens = torch.tensor([*b[n + 1 :], 0], device=lp_full.device).unsqueeze(1)
    diff = (lp_cached.gather(1, tokens) - lp_full.gather(1, tokens))[:-1].abs().max().item()
    out = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "prefix_tokens": args.prefix,
        "own_tokens": args.own,
        "reused": n,
        "full_prefill_s": round(full_s, 4),
        "cached_prefill_s": round(cached_s, 4),
        "ratio": round(cached_s / full_s, 4),
        "max_logprob_diff": diff,
    }
    report.table(
        [
            "device",
            "prefix",
            "reused",
            ("full s", ".4f"),
            ("cached s", ".4f"),
            ("ratio", ".4f"),
            ("max |dlp|", ".2e"),
        ],
        [[args.device, args.prefix, n, full_s, cached_s, cached_s / full_s, diff]],
    )
    report.result(out)


if __name__ == "__main__":
    main()
