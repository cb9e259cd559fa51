"""GPUs on this machine and their free memory, for the checks of whatever asks for one.

An engine's ``device = "cuda"``, a trainer's, vLLM servers to launch and Ray resources
``{GPU = 1}`` all fail late and obscurely on a machine with no GPU (or with a GPU another
process fills): a CUDA error deep in torch, or an actor that Ray never places. The owners
of those settings call ``gpu_headroom`` so the preflight says it in one line first.

The GPUs are read from ``nvidia-smi`` (no torch import, no CUDA context), restricted to
``CUDA_VISIBLE_DEVICES`` when it lists indices. No ``nvidia-smi``: no NVIDIA GPU here.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from attrs import frozen

from slr.preflight import CheckResult, fatal, ok, warn

#: The query command (a module attribute so a test on a machine without GPUs can point it
#: at a stand-in script).
NVIDIA_SMI = "nvidia-smi"
QUERY = ["--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"]
#: A GPU with less free memory than this cannot hold a model: fatal; under the fraction, warn.
FREE_FATAL_MIB = 1024
FREE_WARN_FRACTION = 0.5
DOC = "docs/troubleshooting/startup.md#no-gpu"


@frozen(kw_only=True)
class Gpu:
    index: int
    name: str
    total_mib: int
    free_mib: int

    def describe(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.free_mib / 1024:.1f} of " + (
            f"{self.total_mib / 1024:.1f} GiB free)"
        )


def visible_gpus() -> list[Gpu]:
    """The NVIDIA GPUs this process may use; empty when there is none (or no driver)."""
    exe = shutil.which(NVIDIA_SMI)
    if exe is None:
        return []
    try:
        res = subprocess.run([exe, *QUERY], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if res.returncode != 0:
        return []  # e.g. "NVIDIA-SMI has failed because it couldn't communicate with the driver"
    gpus = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            gpus.append(
                Gpu(
                    index=int(parts[0]),
                    name=parts[1],
                    total_mib=int(parts[2]),
                    free_mib=int(parts[3]),
                )
            )
        except ValueError:
            continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in wanted):
            by_index = {g.index: g for g in gpus}
            gpus = [by_index[int(v)] for v in wanted if int(v) in by_index]
    return gpus


def gpu_headroom(what: str, count: int, *, fix: str) -> CheckResult:
    """``what`` (e.g. ``optimizer.device = 'cuda'``) needs ``count`` GPUs: are they here,
    with memory free? ``fix`` says how to run without them (fatal on a CPU-only machine)."""
    gpus = visible_gpus()
    if not gpus:
        return fatal(
            f"{what} needs {count} GPU(s), but this machine has none visible (no NVIDIA "
            f"driver answering nvidia-smi, or CUDA_VISIBLE_DEVICES hides them)",
            fix=fix,
            doc=DOC,
        )
    if len(gpus) < count:
        return fatal(
            f"{what} needs {count} GPU(s), but only {len(gpus)} are visible: "
            + "; ".join(g.describe() for g in gpus),
            fix=fix,
            doc=DOC,
        )
    used = gpus[:count]
    full = [g for g in used if g.free_mib < FREE_FATAL_MIB]
    if full:
        return fatal(
            f"{what}: " + "; ".join(g.describe() for g in full) + " (another process holds it)",
            fix="stop that process (nvidia-smi lists it), or choose other GPUs with "
            "CUDA_VISIBLE_DEVICES",
            doc=DOC,
        )
    busy = [g for g in used if g.free_mib < FREE_WARN_FRACTION * g.total_mib]
    if busy:
        return warn(
            f"{what}: " + "; ".join(g.describe() for g in busy) + ": less than half is free",
            fix="check nvidia-smi for other processes on it",
            doc=DOC,
        )
    return ok(f"{what}: " + "; ".join(g.describe() for g in used))
