"""The hooks a plugin can implement.

Registration hooks take a ``register`` callback: ``register(name, factory, *,
config_cls=None)``. Event hooks are named ``on_<event>``. Hooks are always called with
keyword arguments and only ever gain arguments, so an implementation may accept any
subset of them. Each hook is documented with its exact signature in
``docs/plugins/hooks.md`` (a test keeps the two in step).
"""

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("slr")
hookimpl = HookimplMarker("slr")


# -- registration -------------------------------------------------------------------------


@hookspec
def register_agents(register):
    """Register agent adapters (scaffolds), implementing ``slr.contracts.AgentAdapter``."""


@hookspec
def register_sandbox_backends(register):
    """Register sandbox backends, implementing ``slr.contracts.SandboxBackend``."""


@hookspec
def register_verifiers(register):
    """Register reward verifiers, implementing ``slr.contracts.Verifier``."""


@hookspec
def register_optimizers(register):
    """Register optimizers (trainers), implementing ``slr.contracts.Optimizer``."""


@hookspec
def register_engines(register):
    """Register inference engines, implementing ``slr.contracts.Engine``."""


@hookspec
def register_commands(cli):
    """Add sub-commands to the ``slr`` click group ``cli`` (``cli.add_command(...)``)."""


# -- events -------------------------------------------------------------------------------


@hookspec
def on_run_started(run_dir, config):
    """A run has started (fresh or resumed); ``run_dir`` is its ``slr.runs.RunDir``."""


@hookspec
def on_trial_finished(run_dir, trial):
    """A trial ended and its ``slr.contracts.TrialResult`` is on disk."""


@hookspec
def on_step_finished(run_dir, step, metrics):
    """Optimizer step ``step`` finished; ``metrics`` is the dict written to metrics.jsonl."""


@hookspec
def on_run_finished(run_dir, status):
    """A run ended; ``status`` is ``"completed"``, ``"failed"`` or ``"interrupted"``."""
