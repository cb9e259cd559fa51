"""The core's preflight checks of this machine's state and the run's topology.

- ``runs-in-flight``: runs under ``run.runs_dir`` that a live process holds (``run.lock``);
- ``proxy-port``: a fixed ``proxy.port`` is free on ``proxy.host``, an address of this machine;
- ``ray-topology``: what ``[run]`` asks of Ray (engine replicas, rollout workers, a trainer,
  each with its resources) fits this machine or the cluster at ``run.ray_address``; an actor
  Ray cannot place waits forever, so a run that does not fit hangs at start;
- ``task-splits``: a task index's train and held-out rows are disjoint, and training reads
  no held-out row.

Registered through ``register_preflight_checks`` like any plugin's (``slr.preflight``).
"""

from __future__ import annotations

import errno
import os
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any

from slr.hookspecs import hookimpl
from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr.preflight.gpus import visible_gpus

DOC_HANG = "docs/troubleshooting/startup.md#hang-at-start"
DOC_SPLITS = "docs/troubleshooting/training.md#held-out-tasks-in-training"


def check_runs_in_flight(ctx: Context) -> CheckResult:
    from slr.run.directory import RunDir

    runs_dir = Path(ctx.config.run.runs_dir)
    live = []
    if runs_dir.is_dir():
        for lock in sorted(runs_dir.glob(f"*/{RunDir.LOCK}")):
            holder = RunDir(lock.parent).holder()
            if holder is not None:
                live.append((lock.parent, holder))
    if not live:
        return ok(f"no run in flight under {runs_dir}")
    shown = "; ".join(
        f"{path.name} (pid {h.get('pid', '?')} on {h.get('host', '?')} since {h.get('since', '?')})"
        for path, h in live[:3]
    )
    return warn(
        f"{len(live)} run(s) in flight under {runs_dir}: {shown}; a new run shares this "
        f"machine's CPUs, memory and GPUs with them",
        fix=f"watch them with `slr status {runs_dir} --all`, or wait for them to finish",
    )


def check_proxy_port(ctx: Context) -> CheckResult | None:
    """A fixed port must be free, and the host one of this machine's (0: a free port)."""
    host, port = ctx.config.proxy.host, ctx.config.proxy.port
    if port == 0 or not ctx.needs_engine():
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return fatal(
                    f"proxy.port = {port} on {host} is taken (another run, or another program)",
                    fix="set proxy.port = 0 (a free port each run), or stop what holds it "
                    f"(`ss -ltnp 'sport = :{port}'`)",
                )
            return fatal(
                f"the proxy cannot listen on proxy.host = {host!r}, port {port} ({exc.strerror})",
                fix="set proxy.host to an address of this machine (127.0.0.1 for one machine)",
            )
    return ok(f"proxy.port = {port} is free on {host}")


# -- Ray topology ----------------------------------------------------------------------------


#: role -> the [run] key of its resources
RESOURCES = {
    "engine_replicas": "engine_resources",
    "rollout_workers": "worker_resources",
    "trainer": "trainer_resources",
}


def _roles(ctx: Context) -> list[tuple[str, int, dict[str, float]]]:
    """(role, how many actors, resources each) for every Ray role this config starts."""
    run = ctx.config.run
    roles = []
    if run.engine_replicas >= 1 and ctx.needs_engine():
        roles.append(("engine_replicas", run.engine_replicas, dict(run.engine_resources)))
    if run.rollout_workers >= 1:
        roles.append(("rollout_workers", run.rollout_workers, dict(run.worker_resources)))
    if run.trainer_resources is not None and ctx.purpose == "run":
        roles.append(("trainer", 1, dict(run.trainer_resources)))
    return roles


def this_machine() -> list[dict[str, float]]:
    """The one node a local Ray has: this machine's CPUs and GPUs (no custom resources)."""
    return [{"CPU": float(os.cpu_count() or 1), "GPU": float(len(visible_gpus()))}]


def _fmt(resources: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k} = {v:g}" for k, v in sorted(resources.items())) + "}"


def fit(
    roles: list[tuple[str, int, dict[str, float]]], nodes: list[dict[str, float]], where: str
) -> CheckResult:
    """Each actor's ask fits on one node, and all the asks together fit the nodes' total."""
    for role, _n, ask in roles:
        for key, amount in ask.items():
            best = max((node.get(key, 0.0) for node in nodes), default=0.0)
            if amount > best:
                return fatal(
                    f"each of run.{role} asks for {_fmt(ask)}, but no node of {where} has "
                    f"{key} = {amount:g} (the largest has {best:g}): Ray never places it, so "
                    f"the run would hang at start",
                    fix=f"lower run.{RESOURCES[role]}, or add a node with {key} >= {amount:g}",
                    doc=DOC_HANG,
                )
    total: dict[str, float] = defaultdict(float)
    parts: dict[str, list[str]] = defaultdict(list)
    for role, n, ask in roles:
        for key, amount in ask.items():
            total[key] += n * amount
            parts[key].append(f"{n} x {amount:g} ({role})")
    have: dict[str, float] = defaultdict(float)
    for node in nodes:
        for key, amount in node.items():
            have[key] += amount
    for key, amount in sorted(total.items()):
        if amount > have[key] + 1e-9:
            return fatal(
                f"the run asks Ray for {key} = {amount:g} ({' + '.join(parts[key])}), but "
                f"{where} has {have[key]:g}: the actors past what fits wait forever (hang at "
                f"start)",
                fix="lower run.engine_replicas / run.rollout_workers or their resources, or "
                "run on a bigger cluster (run.ray_address)",
                doc=DOC_HANG,
            )
    asked = ", ".join(f"{k} = {v:g}" for k, v in sorted(total.items())) or "nothing"
    return ok(f"Ray roles ask for {asked}; {where} has {_fmt(dict(have))}")


def check_ray_topology(ctx: Context) -> CheckResult | None:
    roles = _roles(ctx)
    address = ctx.config.run.ray_address
    remote = address not in (None, "local")
    if not roles:
        return None
    if not remote:
        return fit(roles, this_machine(), "this machine (a local Ray)")
    from slr.cluster.ray_runtime import cluster_nodes

    try:
        nodes = cluster_nodes(str(address))
    except Exception as exc:
        return fatal(
            f"the Ray cluster at run.ray_address = {address!r} does not answer ({exc})",
            fix="start it (`ray start --head`), or fix run.ray_address",
            doc=DOC_HANG,
        )
    return fit(roles, nodes, f"the Ray cluster at {address} ({len(nodes)} node(s))")


def check_ray_gpus(ctx: Context) -> CheckResult | None:
    """GPUs a local Ray would hand out must be here, with memory free."""
    from slr.preflight.gpus import gpu_headroom

    if ctx.config.run.ray_address not in (None, "local"):
        return None  # the cluster's nodes are checked by ray-topology
    asked = sum(n * ask.get("GPU", 0.0) for _role, n, ask in _roles(ctx))
    if asked <= 0:
        return None
    return gpu_headroom(
        f"run.*_resources ask for GPU = {asked:g}",
        int(-(-asked // 1)),
        fix="drop GPU from run.engine_resources / worker_resources / trainer_resources, or "
        "run on a GPU machine",
    )


# -- task splits -----------------------------------------------------------------------------


def check_task_splits(ctx: Context) -> CheckResult | None:
    """An index's train and held-out rows share no task, content or repository, and a
    training run reads no held-out row."""
    from slr.errors import SlrError
    from slr.tasks import index_rows

    path = Path(ctx.config.tasks.path)
    if not (path.is_file() and path.suffix == ".parquet"):
        return None
    try:
        rows = index_rows(path)
    except (SlrError, OSError, ValueError) as exc:
        return fatal(f"{path} does not read as a task index ({exc})", fix="rebuild it")
    if not rows or "split" not in rows[0]:
        return None
    by_split: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_split[str(row.get("split") or "")].append(row)
    train, held = by_split.get("train", []), by_split.get("held-out", [])
    for key in ("id", "content_hash", "repo"):
        shared = {r.get(key) for r in train} & {r.get(key) for r in held} - {None, ""}
        if shared:
            names = ", ".join(sorted(map(str, shared))[:3])
            return fatal(
                f"{path}: train and held-out rows share {len(shared)} {key}(s) ({names}): a "
                f"held-out score would measure tasks the policy trained on",
                fix="rebuild the index with `slr data index` (it splits by repository)",
                doc=DOC_SPLITS,
            )
    split = ctx.config.tasks.split
    if ctx.purpose == "run" and held and split != "train":
        reads = "every row" if not split else f"the {split!r} rows"
        return fatal(
            f"training on {path} reads {reads}, {len(held)} of them held out",
            fix='set tasks.split = "train" (and evaluate on tasks.split = "held-out")',
            doc=DOC_SPLITS,
        )
    return ok(f"{path}: {len(train)} train and {len(held)} held-out rows, disjoint")


@hookimpl
def register_preflight_checks(register):
    register("runs-in-flight", check_runs_in_flight, stage="machine")
    register("proxy-port", check_proxy_port, stage="machine")
    register("ray-topology", check_ray_topology, stage="machine")
    register("gpu", check_ray_gpus, stage="machine")
    register("task-splits", check_task_splits, stage="data")
