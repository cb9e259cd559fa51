"""The hooks a plugin can implement.

Registration hooks take a ``register`` callback (``Register``). Event hooks are named
``on_<event>``. Hooks are always called with keyword arguments and only ever gain
arguments, so an implementation may accept any subset of them. Each hook is documented with
its exact signature and an example in ``docs/plugins/hooks.md`` (a test keeps the two in
step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pluggy import HookimplMarker, HookspecMarker

if TYPE_CHECKING:
    import click

    from slr.config import Config
    from slr.contracts import TrialResult
    from slr.preflight import RegisterCheck
    from slr.run.directory import RunDir

hookspec = HookspecMarker("slr")
hookimpl = HookimplMarker("slr")

RunStatus = Literal["completed", "failed", "interrupted"]
"""How a run ended, as ``on_run_finished`` receives it."""


class Register(Protocol):
    """The callback a registration hook receives.

    ``name`` is what users type (``--agent NAME``); ``factory`` builds the thing, or is a
    lazy ``"package.module:Class"`` string; ``config_cls`` is the attrs class of the
    plugin's config section (the factory is then called with an instance of it).
    """

    def __call__(
        self, name: str, factory: Callable[..., Any] | str, *, config_cls: type | None = None
    ) -> None: ...


# -- registration -------------------------------------------------------------------------


@hookspec
def register_agents(register: Register) -> None:
    """Register agent adapters (scaffolds), implementing ``slr.contracts.AgentAdapter``."""


@hookspec
def register_sandbox_backends(register: Register) -> None:
    """Register sandbox backends, implementing ``slr.contracts.SandboxBackend``."""


@hookspec
def register_verifiers(register: Register) -> None:
    """Register reward verifiers, implementing ``slr.contracts.Verifier``."""


@hookspec
def register_optimizers(register: Register) -> None:
    """Register optimizers (trainers), implementing ``slr.contracts.Optimizer``."""


@hookspec
def register_engines(register: Register) -> None:
    """Register inference engines, implementing ``slr.contracts.Engine``."""


@hookspec
def register_tool_parsers(register: Register) -> None:
    """Register tool-call parsers (``[proxy] tool_parser``), implementing
    ``slr.proxy.toolparse.ToolParser``; the factory takes no arguments."""


@hookspec
def register_loggers(register: Register) -> None:
    """Register metric loggers (``[run] loggers = [NAME, ...]``), implementing
    ``slr.metrics.loggers.MetricLogger``."""


@hookspec
def register_preflight_checks(register: RegisterCheck) -> None:
    """Register preflight checks: ``register(name, check, *, stage="config")``, where
    ``check(ctx: slr.preflight.Context)`` returns ``slr.preflight.CheckResult`` (or several,
    or None when it does not apply to ``ctx.config``)."""


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``slr`` click group ``cli`` (``cli.add_command(...)``)."""


# -- events -------------------------------------------------------------------------------


@hookspec
def on_run_started(run_dir: RunDir, config: Config) -> None:
    """A run has started (fresh or resumed): ``slr run``, ``slr eval`` / ``slr infer`` or
    ``slr serve`` (the ``kind`` of its ``started`` event says which); ``config`` is the
    resolved run config."""


@hookspec
def on_trial_finished(run_dir: RunDir, trial: TrialResult) -> None:
    """A trial ended and its record is on disk in ``run_dir``."""


@hookspec
def on_step_finished(run_dir: RunDir, step: int, metrics: Mapping[str, Any]) -> None:
    """Optimizer step ``step`` finished; ``metrics`` is what was written to metrics.jsonl."""


@hookspec
def on_run_finished(run_dir: RunDir, status: RunStatus) -> None:
    """A run ended; ``status`` is ``"completed"``, ``"failed"`` or ``"interrupted"``."""
