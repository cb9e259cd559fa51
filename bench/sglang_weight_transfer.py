"""SGLang weight updates by route, side by side in one run: disk, distributed (gloo), tensor.

One SGLang STAND-IN process (``plugins/engine-sglang/tests/sglang_standin.py``: SGLang's
weight endpoints for real, an hf model behind them; SGLang itself needs a GPU) serves a
random model; one engine per route pushes the same perturbed state dict ``--repeats``
times, and the time of each ``update_weights`` is reported (median), with the bytes moved
and the ratio to the disk route. The stand-in's loading (a copy into its hf model) is the
same for every route, so the differences are the transfer's: a safetensors write and read
(disk), a TCP broadcast (gloo), a shared-memory hand-over (tensor). CPU only: nccl and
CUDA IPC are not measured here.

    .venv/bin/python bench/sglang_weight_transfer.py                 # hidden 256, 4 layers
    .venv/bin/python bench/sglang_weight_transfer.py --hidden 512 --layers 8 --json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

ROUTES = ("disk", "distributed", "tensor")
ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "plugins" / "engine_sglang" / "sglang_standin.py"


async def _measure(args: argparse.Namespace) -> dict:
    import httpx
    import torch
    from slr_engine_sglang.config import SglangEngineConfig
    from slr_engine_sglang.engine import SglangEngine

    from slr.contracts.weights import payload_bytes
    from slr.engines.server import ServerProcess, free_port
    from slr_testkit import tiny

    model, tok = tiny.tiny_model(layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2)
    work = Path(tempfile.mkdtemp(prefix="slr-bench-weights-"))
    folder = tiny.save(model, tok, work / "model")
    port = free_port("127.0.0.1")
    server = ServerProcess(
        [sys.executable, str(STANDIN), "-m", "sglang.launch_server", "--model-path",
         str(folder), "--host", "127.0.0.1", "--port", str(port)],
        kind="sglang-standin", url=f"http://127.0.0.1:{port}", log_dir=str(work / "logs"),
    )  # fmt: skip
    results: dict[str, list[float]] = {}
    try:
        async with httpx.AsyncClient() as client:
            await server.wait_ready(client, 300)
        gen = torch.Generator().manual_seed(0)
        state = {
            k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()
        }
        for route in ROUTES:
            config = SglangEngineConfig(
                model=str(folder),
                urls=[server.url],
                weight_update=route,
                weights_dir=str(work / "weights"),
                weight_group_backend="gloo",
                trainer_address="127.0.0.1",
                weight_bucket_bytes=args.bucket_mb * 1024 * 1024,
            )
            engine = await SglangEngine(config, url=server.url, tokenizer=tok).start()
            try:
                await engine.update_weights(state)  # opens the group; not timed
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    await engine.update_weights(state)
                    times.append(time.perf_counter() - start)
                results[route] = times
            finally:
                await engine.close()
    finally:
        server.stop()
    nbytes = payload_bytes(state)
    disk = statistics.median(results["disk"])
    rows = {
        route: {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "vs_disk": statistics.median(times) / disk,
            "mb_per_s": nbytes / 1e6 / statistics.median(times),
        }
        for route, times in results.items()
    }
    return {
        "model": {"layers": args.layers, "hidden": args.hidden, "bytes": nbytes},
        "bucket_mb": args.bucket_mb,
        "repeats": args.repeats,
        "routes": rows,
    }


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--bucket-mb", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = harness.Output(args)
    report = asyncio.run(_measure(args))
    m = report["model"]
    out.table(
        [
            ("route", "<"),
            ("median s", ".3f"),
            ("min s", ".3f"),
            ("MB/s", ".1f"),
            ("vs disk", ".2f"),
        ],
        [
            [route, row["median_s"], row["min_s"], row["mb_per_s"], row["vs_disk"]]
            for route, row in report["routes"].items()
        ],
        title=f"model: {m['layers']} layers, hidden {m['hidden']}, {m['bytes'] / 1e6:.1f} MB; "
        f"bucket {report['bucket_mb']} MB; median of {report['repeats']}",
    )
    out.result(report)


if __name__ == "__main__":
    main()
