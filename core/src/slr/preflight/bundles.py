"""The agent-bundle check adapter plugins register: the bundle is built and its binary runs.

A missing bundle is a warning, not a fatal: the run builds it first (``slr.agents.bundles``),
once. A bundle whose binary does not run on this machine is fatal: every trial would end
``agent_error``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slr.agents import bundles
from slr.preflight import CheckResult, fatal, ok, warn

PROBE_TIMEOUT_S = 60.0
#: For a Python bundle: ``python -c VERSION_PROBE DIST VERSION`` exits 0 when the bundle's
#: interpreter runs and holds DIST at VERSION (metadata only: importing an SDK can take a
#: minute on a busy machine).
VERSION_PROBE = (
    "import sys, importlib.metadata as m; v = m.version(sys.argv[1]); print(sys.argv[1], v); "
    "sys.exit(0 if v == sys.argv[2] else f'{sys.argv[1]} is {v}, not {sys.argv[2]}')"
)


def bundle_runs(
    name: str,
    version: str,
    command: Sequence[str],
    *,
    env: Callable[[Path], Mapping[str, str]] | None = None,
) -> CheckResult:
    """``command`` (its first item relative to the bundle folder, e.g.
    ``node_modules/.bin/opencode``) must exit 0 in the built bundle ``name-version``.

    ``env(bundle_folder)`` adds to the environment it runs in (a Python bundle's
    ``slr.agents.bundle_recipes.python_env``)."""
    found = bundles.existing(name, version)
    if found is None:
        return warn(
            f"bundle {name}-{version} is not built yet: the run builds it before its first "
            f"trial (minutes, once)",
            fix=f"build it ahead with `slr bundles build {name}`",
            doc="docs/troubleshooting/startup.md#hang-at-start",
        )
    argv = [str(found.path / command[0]), *command[1:]]
    shown = " ".join([command[0], *(a if len(a) <= 40 else "<probe>" for a in command[1:])])
    rebuild = f"rm -rf {found.path} && slr bundles build {name}"
    try:
        extra = dict(env(found.path)) if env is not None else {}
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env={**os.environ, **extra},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return fatal(f"bundle {name}-{version}: `{shown}` does not run ({exc})", fix=rebuild)
    if res.returncode != 0:
        said = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return fatal(
            f"bundle {name}-{version}: `{shown}` exits {res.returncode} ({said[0][:160]})",
            fix=rebuild,
        )
    first = res.stdout.strip().splitlines()[:1] or [""]
    return ok(f"bundle {name}-{version} at {found.path}: `{shown}` runs ({first[0][:80]})")
