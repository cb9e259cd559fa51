"""The local backend's preflight: bubblewrap is there when the config relies on it."""

from __future__ import annotations

from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr_backend_local.isolation import bwrap_path

DOC = "docs/troubleshooting/sandboxes.md#no-bubblewrap"


def check_isolation(ctx: Context) -> CheckResult | None:
    if not ctx.uses("backend", "local"):
        return None
    options = ctx.options("backend")
    found = bwrap_path()
    if found is not None and options.isolation != "none":
        return ok(f"bubblewrap at {found}: each trial runs in its own namespaces")
    if options.isolation == "bubblewrap":
        return fatal(
            "backend.isolation = 'bubblewrap' but bwrap is not installed",
            fix="apt-get install bubblewrap, or use --backend docker",
            doc=DOC,
        )
    if not options.unsafe_host_paths:
        return fatal(
            "the local backend has no isolation here (no bubblewrap, or isolation = 'none'), "
            "so it refuses to start sandboxes: a task's /app and /logs would be this machine's",
            fix="apt-get install bubblewrap, use --backend docker, or (trusted tasks only) set "
            "backend.unsafe_host_paths = true",
            doc=DOC,
        )
    return warn(
        "no isolation: commands run directly on this machine (backend.unsafe_host_paths)",
        fix="install bubblewrap for real sandboxes",
        doc=DOC,
    )
