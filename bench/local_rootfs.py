"""Local backend: trial start (to first exec) in the task image's root vs the host's userland
vs docker, cold and warm, measured side by side in one run.

    .venv/bin/python bench/local_rootfs.py [--reps 5] [--json]

Needs bubblewrap, a docker daemon and the base image (``slr images base``). Modes:

- ``local host``: ``[backend] rootfs = "host"`` (the host's /usr, the steps replayed on it);
- ``local image overlay``: ``rootfs = "image"``, each trial an overlayfs upper layer;
- ``local image copy``: ``rootfs = "image"``, each trial a ``cp -a`` of the built root;
- ``docker``: the docker backend.

**cold**: a task whose environment nobody built yet (a copy of ``hello-world`` with a fresh
file in its context) and, for the image modes, an empty unpacked-image folder: unpack (or
image build) + task build + start + first exec. **warm**: start + ``exec("true")`` with
everything cached, interleaved across modes, medians. Ratios are against docker warm.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Literal

import harness

from slr.plugins import get_plugin_manager
from slr.rollout.trial import new_trial_id
from slr.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "hello-world"
MODES = ("local host", "local image overlay", "local image copy", "docker")
#: the local modes' ``[backend]`` rootfs and root_copy
LAYOUTS: dict[str, tuple[Literal["host", "image"], Literal["auto", "overlay", "copy"]]] = {
    "local host": ("host", "auto"),
    "local image overlay": ("image", "overlay"),
    "local image copy": ("image", "copy"),
}


def _backend(mode: str, scratch: Path, images_dir: Path):
    if mode == "docker":
        return get_plugin_manager().get("sandbox_backend", "docker").create()
    from slr_backend_local import LocalBackendConfig
    from slr_backend_local.backend import LocalBackend

    kind, copy = LAYOUTS[mode]
    return LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            rootfs=kind,
            root_copy=copy,
            workspace_dir=str(scratch / "ws"),
            cache_dir=str(scratch / f"cache-{mode.replace(' ', '-')}"),
            images_dir=str(images_dir),
        )
    )


async def _first_exec(backend, task) -> float:
    t0 = time.perf_counter()
    sb = await backend.start(task, trial_id=new_trial_id("bench"), labels={"slr.bench": "1"})
    try:
        res = await sb.exec("true")
        elapsed = time.perf_counter() - t0
        assert res.ok, res
    finally:
        await sb.stop()
    return elapsed


def _fresh_task(scratch: Path):
    folder = scratch / f"task-{uuid.uuid4().hex[:8]}"
    shutil.copytree(TASK, folder)
    (folder / "environment" / "nonce.txt").write_text(uuid.uuid4().hex)
    return load_task(folder)


async def main(reps: int, modes: tuple[str, ...] = MODES) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="slr-bench-rootfs-"))
    backends = {}
    cold: dict[str, float] = {}
    built_images: list[str] = []
    try:
        for mode in modes:
            images_dir = scratch / f"images-{mode.replace(' ', '-')}"  # empty: cold unpack
            backends[mode] = _backend(mode, scratch, images_dir)
            task = _fresh_task(scratch)
            cold[mode] = await _first_exec(backends[mode], task)
            if mode == "docker":
                from slr_backend_docker.tags import image_tag

                built_images.append(image_tag(backends[mode].config.image_prefix, task))
        warm: dict[str, list[float]] = {m: [] for m in modes}
        task = load_task(TASK)
        for b in backends.values():  # build once, not timed
            await b.prepare(task)
        for _ in range(reps):
            for mode in modes:  # interleaved: the machine's load hits every mode alike
                warm[mode].append(await _first_exec(backends[mode], task))
    finally:
        for b in backends.values():
            await b.close()
        if built_images:
            import docker
            import docker.errors

            client = docker.from_env()
            for tag in built_images:
                try:
                    client.images.remove(tag, noprune=False)
                except docker.errors.DockerException:
                    pass
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {m: statistics.median(v) for m, v in warm.items()}
    return {
        "task": "hello-world (FROM slr-base:bookworm)",
        "reps": reps,
        "load_average": round(os.getloadavg()[0], 1),
        "cold_s": {m: round(v, 3) for m, v in cold.items()},
        "warm_median_s": {m: round(v, 3) for m, v in medians.items()},
        "warm_ratio_vs_docker": {m: round(v / medians["docker"], 2) for m, v in medians.items()},
    }


def _table(result: dict, out: harness.Output) -> None:
    out.table(
        [
            ("mode", "<"),
            ("cold: to first exec", lambda v: f"{v:.2f} s"),
            ("warm: start → first exec (median)", lambda v: f"{v:.2f} s"),
            ("warm / docker", lambda v: f"{v:.2f}×"),
        ],
        [
            [m, result["cold_s"][m], result["warm_median_s"][m], result["warm_ratio_vs_docker"][m]]
            for m in result["cold_s"]
        ],
    )


if __name__ == "__main__":
    parser = harness.parser(__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--mode",
        action="append",
        choices=MODES,
        help="modes to measure (repeatable; default: all). 'docker' is always measured: "
        "the ratios are against it",
    )
    args = parser.parse_args()
    out = harness.Output(args)
    modes = tuple(m for m in MODES if m in (args.mode or MODES) or m == "docker")
    result = asyncio.run(main(args.reps, modes))
    _table(result, out)
    out.result(result)
