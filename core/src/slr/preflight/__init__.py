"""Preflight: every check a run's config and this machine must pass before any work starts.

``slr preflight``, and ``slr run`` / ``slr eval`` before they start an engine or a sandbox,
call ``run_preflight``. The checks come from plugins through the ``register_preflight_checks``
hook (the core's own checks are a built-in plugin, ``slr.preflight.core_checks``),
so a backend checks its own daemon and an engine its own model. Each check belongs to a
``Stage``; stages run cheapest first and a fatal result ends the preflight after its stage,
so a wrong knob is reported in well under a second, before a model is loaded:

- ``config``: the resolved config alone (plugins, versions, silent pitfalls); no I/O;
- ``machine``: this machine's services and headroom (daemons, APIs, disk, memory);
- ``data``: what must be present here (tasks, the model and its tokenizer, agent bundles).

``--structure-only`` runs the ``config`` stage only: what can be judged with no data, no
model and no service on this machine. A check that raises is reported as a fatal line
naming the check, never as a traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from attrs import frozen

from slr.errors import UsageError

if TYPE_CHECKING:
    from slr.config import Config
    from slr.contracts import SandboxBackend

Status = Literal["pass", "warn", "fatal"]
Stage = Literal["config", "machine", "data"]
Purpose = Literal["run", "eval"]
STAGES: tuple[Stage, ...] = ("config", "machine", "data")


@frozen(kw_only=True)
class CheckResult:
    """One line of the preflight: what was checked, how it went, and what to do."""

    status: Status
    message: str
    fix: str = ""
    doc: str = ""
    """A troubleshooting page (``docs/troubleshooting/<page>.md#anchor``) for this symptom."""

    def line(self, check: str) -> str:
        text = f"{self.status:5}  {check}: {self.message}"
        if self.fix:
            text += f". Fix: {self.fix}"
        if self.doc:
            text += f" (see {self.doc})"
        return text


def ok(message: str) -> CheckResult:
    return CheckResult(status="pass", message=message)


def warn(message: str, *, fix: str = "", doc: str = "") -> CheckResult:
    return CheckResult(status="warn", message=message, fix=fix, doc=doc)


def fatal(message: str, *, fix: str, doc: str = "") -> CheckResult:
    """A result that stops the run; ``fix`` is required: a fatal always names its fix."""
    return CheckResult(status="fatal", message=message, fix=fix, doc=doc)


class Plugins(Protocol):
    """What the preflight needs of the plugin manager (``slr.plugins.PluginManager``)."""

    def get(self, kind: str, name: str) -> Any: ...

    def build(self, config: Config, section: Literal["backend"]) -> SandboxBackend: ...

    def preflight_checks(self) -> list[Check]: ...


@frozen(kw_only=True)
class Context:
    """What a check is given: the resolved config, the plugins, and what is about to run."""

    config: Config
    plugins: Plugins
    purpose: Purpose = "run"
    checkpoint: Path | None = None
    """The checkpoint an eval serves (``slr eval --checkpoint``), as given; None otherwise."""

    def uses(self, section: str, name: str) -> bool:
        """Whether the config's ``[section]`` names plugin ``name`` (``uses("backend", "k8s")``)."""
        return getattr(self.config, section).name == name

    def options(self, section: str) -> Any:
        """The validated options of the config's ``[section]`` plugin."""
        return getattr(self.config, section).options

    def agent_attribute(self, name: str, default: Any) -> Any:
        """An attribute of the chosen agent's class (``protocol``, ``needs_model``), read
        without building the agent; ``default`` when it cannot be loaded."""
        try:
            factory = self.plugins.get("agent", self.config.agent.name).load()
        except Exception:
            return default
        return getattr(factory, name, default)

    def needs_engine(self) -> bool:
        """Whether this command starts an engine: training always does; an eval only for an
        agent that calls the model (``oracle`` and ``nop`` do not)."""
        return self.purpose == "run" or bool(self.agent_attribute("needs_model", True))


CheckFn = Callable[[Context], "CheckResult | Iterable[CheckResult] | None"]
"""A check: one result, several, or None when it does not apply to this config."""


class RegisterCheck(Protocol):
    """The callback ``register_preflight_checks`` receives.

    ``name`` is what the preflight line shows (``docker-daemon``); ``check(ctx)`` returns
    ``CheckResult`` (or several, or None when it does not apply); ``stage`` is what it
    needs: ``"config"``, ``"machine"`` or ``"data"``.
    """

    def __call__(self, name: str, check: CheckFn, *, stage: Stage = "config") -> None: ...


@frozen(kw_only=True)
class Check:
    name: str
    fn: CheckFn
    stage: Stage
    plugin: str


@frozen(kw_only=True)
class Line:
    check: str
    stage: Stage
    result: CheckResult

    def text(self) -> str:
        return self.result.line(self.check)


@frozen(kw_only=True)
class Report:
    lines: tuple[Line, ...]
    skipped_stages: tuple[Stage, ...] = ()
    seconds: float = 0.0

    @property
    def fatal(self) -> list[Line]:
        return [line for line in self.lines if line.result.status == "fatal"]

    @property
    def ok(self) -> bool:
        return not self.fatal

    def summary(self) -> str:
        counts = {
            s: sum(line.result.status == s for line in self.lines)
            for s in ("pass", "warn", "fatal")
        }
        text = f"preflight: {counts['pass']} pass, {counts['warn']} warn, {counts['fatal']} fatal"
        if self.skipped_stages:
            text += f"; not run: {', '.join(self.skipped_stages)} checks (fix the fatal first)"
        return text + f" ({self.seconds:.1f}s)"


class PreflightFailed(UsageError):
    """The preflight found a fatal problem; the message is the fatal lines."""


def _results(value: CheckResult | Iterable[CheckResult] | None) -> Iterator[CheckResult]:
    if value is None:
        return
    if isinstance(value, CheckResult):
        yield value
        return
    yield from value


def run_checks(
    checks: Sequence[Check],
    ctx: Context,
    *,
    stages: Sequence[Stage] = STAGES,
    on_line: Callable[[Line], None] | None = None,
) -> Report:
    """Run ``checks`` stage by stage (cheapest first); stop after a stage with a fatal."""
    started = time.monotonic()
    lines: list[Line] = []
    skipped: list[Stage] = []
    for stage in STAGES:
        if stage not in stages:
            continue
        if any(line.result.status == "fatal" for line in lines):
            skipped.append(stage)
            continue
        for check in (c for c in checks if c.stage == stage):
            try:
                results = list(_results(check.fn(ctx)))
            except Exception as exc:  # a broken check is a finding, not a traceback
                results = [
                    fatal(
                        f"the check itself failed ({type(exc).__name__}: {exc})",
                        fix=f"report it to the distribution of plugin {check.plugin!r}, or "
                        f"run with --skip-preflight",
                    )
                ]
            for result in results:
                line = Line(check=check.name, stage=stage, result=result)
                lines.append(line)
                if on_line is not None:
                    on_line(line)
    return Report(
        lines=tuple(lines), skipped_stages=tuple(skipped), seconds=time.monotonic() - started
    )


def run_preflight(
    config: Config,
    plugins: Plugins,
    *,
    purpose: Purpose = "run",
    structure_only: bool = False,
    on_line: Callable[[Line], None] | None = None,
    checkpoint: Path | None = None,
) -> Report:
    """Every registered check against ``config``; see the module docstring."""
    ctx = Context(config=config, plugins=plugins, purpose=purpose, checkpoint=checkpoint)
    stages: tuple[Stage, ...] = ("config",) if structure_only else STAGES
    return run_checks(plugins.preflight_checks(), ctx, stages=stages, on_line=on_line)


def require(report: Report, *, shown: bool = False) -> None:
    """Raise ``PreflightFailed`` unless ``report`` passed: one line per fatal, each with its
    fix (only a count when ``shown``: the caller already printed them)."""
    if report.ok:
        return
    count = f"preflight found {len(report.fatal)} fatal problem(s)"
    if shown:
        raise PreflightFailed(f"{count} (above); nothing was started")
    fatal_lines = "\n".join(line.text() for line in report.fatal)
    raise PreflightFailed(f"{count}; nothing was started:\n{fatal_lines}")
