"""What a Python scaffold imports before its first model call, and what that costs, in its bundle.

    .venv/bin/python bench/scaffold_imports.py --agent openhands --agent terminus [--runs 5] [--json]

Runs the adapter's own bundle interpreter (built or taken from the cache as a trial would)
on the modules its driver imports (the required entries of the driver's ``PRELOAD``), with
the driver's environment, outside any sandbox, and reports per scaffold:

- ``CPU s``: the interpreter's CPU from start to the imports done, medians of ``--runs``
  fresh interpreters, with Python's default garbage collection (``before``) and with the
  collector paused during the import and the result frozen (``after``:
  ``slr.agents.prestart_main.frozen_imports``, the adapters' ``freeze_imports``), the two
  interleaved run by run so load drift hits both alike;
- ``modules``: how many modules the imports load;
- the packages with the largest share of ``python -X importtime``'s self time;
- ``litellm deferrable``: whether a ``LazyLoader`` (``importlib.util.LazyLoader``) put in
  front of ``litellm`` keeps it from executing through the imports, and if not, the
  scaffold's line that executes it (the first attribute of litellm it uses). A scaffold
  that only said ``import litellm`` and used it later could be given a lazy litellm; one
  that says ``from litellm import X`` at the top of a module it imports cannot.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from typing import Any

import harness

from slr.agents.bundle_recipes import python_bin, python_env
from slr.agents.prestart_main import FREEZE_IMPORTS_ENV
from slr.contracts import Endpoint
from slr.plugins import get_plugin_manager

PYTHON_SCAFFOLDS = ("openhands", "terminus")
NO_ENDPOINT = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="-", model="-")

# Runs on the bundle's interpreter (standard library only).
PROBE = r"""
import gc, importlib, importlib.abc, importlib.util, json, resource, sys, traceback

mode, modules = sys.argv[1], sys.argv[2:]
out = {}
if mode.startswith("lazy:"):
    lib, executed = mode[5:], []

    class Recorder(importlib.abc.Loader):
        # The real loader, noting where the lazy module was first used.
        def __init__(self, real):
            self.real = real

        def create_module(self, spec):
            return self.real.create_module(spec)

        def exec_module(self, module):
            executed.append(traceback.extract_stack()[:-1])
            self.real.exec_module(module)

    class Lazy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != lib:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            spec.loader = importlib.util.LazyLoader(Recorder(spec.loader))
            return spec

    sys.meta_path.insert(0, Lazy())
if mode == "frozen":
    gc.disable()
try:
    for name in modules:
        importlib.import_module(name)
except Exception as exc:
    if not mode.startswith("lazy:"):
        raise
    out["error"] = f"{type(exc).__name__}: {exc}"[:300]
if mode == "frozen":
    gc.freeze()
    gc.enable()
usage = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_s"] = usage.ru_utime + usage.ru_stime
out["modules"] = len(sys.modules)
if mode.startswith("lazy:"):
    out["imported"] = lib in sys.modules
    out["executed"] = bool(executed)
    if executed:
        # the last frame that is neither the import machinery nor this probe
        frames = [
            f for f in executed[0]
            if not f.filename.startswith("<") and "importlib" not in f.filename
            and f.filename != "<string>"
        ]
        f = frames[-1]
        site = f.filename.split("site-packages/")[-1]
        out["by"] = f"{site}:{f.lineno}: {(f.line or '').strip()}"
print(json.dumps(out))
"""


def _driver_modules(agent_name: str) -> list[str]:
    import importlib

    driver = importlib.import_module(f"slr_adapter_{agent_name}.driver")
    return [m for m in driver.PRELOAD if not m.startswith("?")]


def _run(python: str, env: dict[str, str], args: list[str], *flags: str) -> dict[str, Any]:
    proc = subprocess.run(
        [python, *flags, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"the probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.splitlines()[-1]), "stderr": proc.stderr}


def _importtime_shares(stderr: str, top: int) -> list[tuple[str, float]]:
    """Top-level packages by their share of the imports' self time (``-X importtime``)."""
    per: dict[str, int] = {}
    for line in stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header, or not importtime's
        package = fields[2].strip().split(".")[0]
        per[package] = per.get(package, 0) + int(fields[0])
    total = sum(per.values()) or 1
    ranked = sorted(per.items(), key=lambda kv: -kv[1])[:top]
    return [(name, round(us / total, 3)) for name, us in ranked]


def bench(agent_name: str, runs: int) -> dict[str, Any]:
    agent = get_plugin_manager().get("agent", agent_name).create()
    bundle = agent.bundle()
    root = str(bundle.path)
    python = python_bin(root, agent.config.python)
    # the driver's environment (an endpoint that is never called: only imports run)
    _, driver_env = agent.command(root, NO_ENDPOINT)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        **driver_env,
        **python_env(root),
    }
    env.pop(FREEZE_IMPORTS_ENV, None)  # the probe chooses
    modules = _driver_modules(agent_name)
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    count = 0
    for _ in range(runs):
        for setting, mode in (("before", "default"), ("after", "frozen")):
            r = _run(python, env, [mode, *modules])
            cpu[setting].append(r["cpu_s"])
            count = r["modules"]
    lazy = _run(python, env, ["lazy:litellm", *modules])
    timed = _run(python, env, ["default", *modules], "-X", "importtime")
    before, after = (round(statistics.median(v), 3) for v in cpu.values())
    return {
        "agent": agent_name,
        "bundle": bundle.path.name,
        "imports": modules,
        "modules": count,
        "cpu_s": {"before": before, "after": after},
        "ratio": round(before / after, 3) if after else None,
        "importtime_shares": _importtime_shares(timed["stderr"], 6),
        "litellm_deferrable": not lazy["executed"],
        "litellm_executed_by": lazy.get("by"),
        # what the imports did with litellm behind a LazyLoader (None: they went through)
        "lazy_litellm_error": lazy.get("error"),
    }


def main() -> None:
    p = harness.parser(__doc__, whole_doc=True)
    p.add_argument("--agent", action="append", help="openhands (default) and/or terminus")
    p.add_argument("--runs", type=int, default=5, help="fresh interpreters per setting")
    args = p.parse_args()
    out = harness.Output(args)
    names = args.agent or ["openhands"]
    unknown = sorted(set(names) - set(PYTHON_SCAFFOLDS))
    if unknown:
        raise SystemExit(f"--agent {unknown}: this bench knows {', '.join(PYTHON_SCAFFOLDS)}")
    reports = [bench(name, args.runs) for name in names]
    rows: list[list[object]] = []
    for r in reports:
        c = r["cpu_s"]
        litellm = f"{'yes' if r['litellm_deferrable'] else 'no'}: {r['litellm_executed_by']}"
        if r["lazy_litellm_error"]:
            litellm += f" (then: {r['lazy_litellm_error']})"
        shares = ", ".join(f"{n} {s:.0%}" for n, s in r["importtime_shares"])
        rows.append([r["agent"], r["modules"], c["before"], c["after"], r["ratio"], litellm])
        rows.append(["", "", "", "", "", shares])
    out.table(
        [
            ("agent", "<"),
            ("modules", ">"),
            ("before CPU s", ">.3f"),
            ("after CPU s", ">.3f"),
            ("ratio", ">.2f"),
            ("litellm deferrable / executed by; largest import-time shares", "<"),
        ],
        rows,
    )
    out.result({"reports": reports})


if __name__ == "__main__":
    main()
