"""The core's preflight checks: plugins and versions, silent pitfalls, headroom, tasks.

Registered through ``register_preflight_checks`` like any plugin's (``slr.preflight``).
Checks of one plugin's own world (a daemon, a model, a bundle) live in that plugin.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tomllib
from importlib import metadata
from pathlib import Path

import attrs

from slr.config import PLUGIN_SECTIONS, RolloutSection
from slr.errors import SlrError
from slr.hookspecs import hookimpl
from slr.plugins import CORE_DISTRIBUTION
from slr.preflight import CheckResult, Context, fatal, ok, warn

GiB = 1024**3
#: Below these, a run cannot finish (fatal) or is likely to hit the wall (warn).
DISK_FATAL, DISK_WARN = 1 * GiB, 10 * GiB
MEMORY_FATAL, MEMORY_WARN = 1 * GiB, 4 * GiB
#: Advantage estimators that compare the samples of one group with each other.
GROUP_ESTIMATORS = {"grpo", "rloo", "grpo_passk", "rloo_vectorized", "opo", "gpg"}


def _sections(ctx: Context) -> list[str]:
    sections = [s for s in PLUGIN_SECTIONS if not (s == "optimizer" and ctx.purpose == "eval")]
    if not ctx.needs_engine():
        sections.remove("engine")
    return sections


def _requirement_on_core(dist: str) -> str | None:
    """The version specifier a distribution declares on slr-core, if any (``==0.1.0``)."""
    try:
        requires = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return None
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        # "slr-core[cluster]>=0.1": the extras are not part of the version specifier
        if req.name.replace("_", "-").lower() == CORE_DISTRIBUTION:
            return str(req.specifier) or None
    return None


def _satisfies(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)


def check_plugins(ctx: Context) -> list[CheckResult]:
    """Each chosen plugin is installed, its factory's module is importable, and the
    distribution that ships it accepts the installed slr-core."""
    from slr import __version__

    chosen = [(s, PLUGIN_SECTIONS[s], getattr(ctx.config, s).name) for s in _sections(ctx)]
    chosen += [("run.loggers", "logger", name) for name in ctx.config.run.loggers]
    results = []
    for where, kind, name in chosen:
        try:
            reg = ctx.plugins.get(kind, name)
        except SlrError as exc:
            results.append(fatal(str(exc), fix=f"install it, or choose another in [{where}]"))
            continue
        if isinstance(reg.factory, str):
            module = reg.factory.partition(":")[0]
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            if not found:
                results.append(
                    fatal(
                        f"{where} {name!r} from {reg.plugin.describe()} points at module "
                        f"{module!r}, which is not installed",
                        fix=f"reinstall {reg.plugin.distribution or 'that plugin'}",
                    )
                )
                continue
        dist = reg.plugin.distribution
        spec = _requirement_on_core(dist) if dist and dist != CORE_DISTRIBUTION else None
        if spec is not None and not _satisfies(__version__, spec):
            results.append(
                fatal(
                    f"{where} {name!r}: {dist} {reg.plugin.version} needs slr-core{spec}, "
                    f"but slr-core {__version__} is installed",
                    fix=f"pip install -U {dist} slr-core (matching versions)",
                )
            )
            continue
        version = f" {reg.plugin.version}" if reg.plugin.version else ""
        results.append(ok(f"{where} = {name!r} ({dist or 'in-process'}{version})"))
    return results


def check_tool_parser(ctx: Context) -> CheckResult | None:
    if "engine" not in _sections(ctx):
        return None
    from slr.proxy.toolparse import get_tool_parser

    try:
        get_tool_parser(ctx.config.proxy.tool_parser)
    except SlrError as exc:
        return fatal(str(exc), fix="set proxy.tool_parser to one of the known parsers")
    return ok(f"proxy.tool_parser = {ctx.config.proxy.tool_parser!r} is known")


def trained_temperature(checkpoint: Path) -> tuple[Path, float] | None:
    """The ``rollout.temperature`` the run that wrote ``checkpoint`` (a checkpoint folder, or
    the run folder) trained at, and that run's config; None when it is no run's, or unreadable
    (the eval itself reports a wrong ``--checkpoint``)."""
    from slr.run.directory import RunDir

    for folder in (checkpoint, checkpoint.parent.parent):
        path = folder / RunDir.CONFIG
        if path.is_file():
            try:
                rollout = tomllib.loads(path.read_text()).get("rollout", {})
                default = attrs.fields(RolloutSection).temperature.default
                return path, float(rollout.get("temperature", default))
            except (OSError, ValueError, TypeError, AttributeError):
                return None
    return None


def _eval_temperature(ctx: Context) -> CheckResult | None:
    """An eval of a checkpoint sampling at another temperature than its run trained at: its
    pass@k is not comparable with the run's reward curve (a greedy eval may be on purpose,
    so this warns)."""
    if ctx.purpose != "eval" or ctx.checkpoint is None:
        return None
    trained = trained_temperature(Path(ctx.checkpoint))
    if trained is None:
        return None
    source, temperature = trained
    now = ctx.config.rollout.temperature
    if now == temperature:
        return None
    return warn(
        f"this eval samples at rollout.temperature = {now:g}, but the checkpoint's run trained "
        f"at {temperature:g} ({source}): its pass@k measures another sampling policy than the "
        f"run's reward curve",
        fix=f"--set rollout.temperature={temperature:g} to compare with training (keep "
        f"{now:g} only if that is the point, e.g. a greedy pass@1)",
        doc="docs/troubleshooting/training.md#eval-disagrees-with-training-reward",
    )


def check_pitfalls(ctx: Context) -> list[CheckResult]:
    """Settings that are valid one by one but make training learn nothing, silently."""
    cfg = ctx.config
    found: list[CheckResult] = []
    r, alg = cfg.rollout, cfg.algorithm
    if ctx.purpose == "run":
        if r.n_per_task == 1 and alg.adv_estimator in GROUP_ESTIMATORS:
            found.append(
                fatal(
                    f"rollout.n_per_task = 1 with algorithm.adv_estimator = "
                    f"{alg.adv_estimator!r}: a group of one sample has advantage 0, so no "
                    f"step changes the policy",
                    fix="set rollout.n_per_task to 4 or more (8-16 for a weak base model)",
                    doc="docs/troubleshooting/training.md#reward-never-moves",
                )
            )
        if r.temperature == 0:
            found.append(
                fatal(
                    "rollout.temperature = 0 in training: greedy samples of a group are "
                    "identical (no signal) and their log-probs are not those of a policy",
                    fix="set rollout.temperature = 1.0 (lower only for evaluation)",
                    doc="docs/troubleshooting/training.md#reward-never-moves",
                )
            )
        if cfg.proxy.client_sampling == "honor":
            found.append(
                fatal(
                    "proxy.client_sampling = 'honor' in training: the agent's own temperature "
                    "decides sampling, so behaviour log-probs differ from what the trainer "
                    "scores",
                    fix="set proxy.client_sampling = 'ignore' (the default) for slr run",
                    doc="docs/troubleshooting/training.md#log-prob-agreement-falling",
                )
            )
        ref = getattr(cfg.optimizer.options, "ref_model", "")
        if ref and not alg.use_kl_loss:
            found.append(
                warn(
                    f"optimizer.ref_model = {ref!r} but algorithm.use_kl_loss = false: the "
                    f"reference model is never used",
                    fix="set algorithm.use_kl_loss = true, or drop optimizer.ref_model",
                )
            )
    if ctx.purpose == "run" and alg.clip_ratio_low >= 1.0:
        found.append(
            fatal(
                f"algorithm.clip_ratio_low = {alg.clip_ratio_low}: the ratio's lower bound "
                f"1 - clip_ratio_low is {1 - alg.clip_ratio_low:g}, so a lowered token is never "
                f"clipped and one bad step can collapse it",
                fix="set algorithm.clip_ratio_low below 1 (0.2 is usual)",
            )
        )
    if ctx.purpose == "run" and r.dynamic_sampling and r.max_oversample == 0:
        found.append(
            warn(
                "rollout.dynamic_sampling with max_oversample = 0: groups without reward "
                "variance are dropped and never replaced, so steps train on fewer groups",
                fix="set rollout.max_oversample to 1 or more",
            )
        )
    if r.top_p < 1.0 and ctx.purpose == "run":
        found.append(
            warn(
                f"rollout.top_p = {r.top_p}: behaviour log-probs are taken before top-p "
                f"truncation, so tokens outside the nucleus are never sampled but still scored",
                fix="keep rollout.top_p = 1.0 for training",
            )
        )
    if (mismatch := _eval_temperature(ctx)) is not None:
        found.append(mismatch)
    per_step = r.tasks_per_step * r.n_per_task
    if ctx.purpose == "run" and per_step < r.concurrency:
        found.append(
            warn(
                f"rollout.concurrency = {r.concurrency} but a step has only {per_step} trials "
                f"(tasks_per_step x n_per_task): the extra slots stay idle",
                fix=f"lower rollout.concurrency to {per_step}, or raise tasks_per_step",
            )
        )
    return found or [ok("no known silent pitfall in [rollout] / [algorithm] / [proxy]")]


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_disk_bytes(path: Path) -> int:
    return shutil.disk_usage(_existing(path)).free


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _headroom(what: str, free: int, fatal_at: int, warn_at: int, fix: str) -> CheckResult:
    text = f"{what}: {free / GiB:.1f} GiB free"
    if free < fatal_at:
        return fatal(f"{text} (needs at least {fatal_at / GiB:.0f} GiB)", fix=fix)
    if free < warn_at:
        return warn(f"{text} (under {warn_at / GiB:.0f} GiB)", fix=fix)
    return ok(text)


def check_disk(ctx: Context) -> list[CheckResult]:
    cache = Path(os.environ.get("SLR_CACHE_DIR") or Path.home() / ".cache" / "slr")
    places = {"run.runs_dir": ctx.config.run.runs_dir, "cache (SLR_CACHE_DIR)": cache}
    return [
        _headroom(
            f"disk at {name} {_existing(Path(path))}",
            free_disk_bytes(Path(path)),
            DISK_FATAL,
            DISK_WARN,
            f"free space there, or point {name} at a bigger disk",
        )
        for name, path in places.items()
    ]


def check_memory(ctx: Context) -> CheckResult | None:
    free = available_memory_bytes()
    if free is None:
        return None
    return _headroom(
        "memory",
        free,
        MEMORY_FATAL,
        MEMORY_WARN,
        "stop other jobs, or lower rollout.concurrency and the engine's max_batch",
    )


def check_tasks(ctx: Context) -> CheckResult:
    """The task set loads (every task.toml parses, every include is found) and is big
    enough; the same loader the run uses."""
    from slr.tasks import load_tasks

    path = ctx.config.tasks.path
    try:
        tasks = load_tasks(path, include=ctx.config.tasks.include, split=ctx.config.tasks.split)
    except SlrError as exc:
        return fatal(str(exc), fix="fix tasks.path / tasks.include, then `slr check-tasks PATH`")
    if not tasks:
        return fatal(
            f"no tasks under tasks.path = {str(path)!r}", fix="point tasks.path at Harbor tasks"
        )
    per_step = ctx.config.rollout.tasks_per_step
    if ctx.purpose == "run" and len(tasks) < per_step:
        return warn(
            f"{len(tasks)} task(s) but rollout.tasks_per_step = {per_step}: tasks repeat "
            f"within a step",
            fix=f"lower rollout.tasks_per_step to {len(tasks)} or add tasks",
        )
    return ok(f"{len(tasks)} task(s) under {path} load; validate them with `slr check-tasks`")


@hookimpl
def register_preflight_checks(register):
    register("plugins", check_plugins, stage="config")
    register("tool-parser", check_tool_parser, stage="config")
    register("pitfalls", check_pitfalls, stage="config")
    register("disk", check_disk, stage="machine")
    register("memory", check_memory, stage="machine")
    register("tasks", check_tasks, stage="data")
