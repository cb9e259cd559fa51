"""The plugin manager: loads the ``slr`` entry points once and keeps the registries.

Every agent, sandbox backend, verifier, optimizer and engine is registered by a plugin
through a ``register_<kind>s(register)`` hook. The manager records which distribution (and
version) registered what, so errors and ``slr plugins`` can name them. The core's own
plugins (``BUILTIN_PLUGINS``) are registered first, attributed to slr-core, so nothing the
core needs comes from another distribution. Each is an ordinary plugin module (hook
implementations) that lives beside the concern it serves: ``slr.agents.plugin`` (the
``oracle`` and ``nop`` agents), ``slr.proxy.plugin`` (the ``hermes`` tool-call parser),
``slr.preflight.*_checks`` (the core's checks), ``slr.metrics.plugin`` (feeds the metric
loggers); no entry point is needed, so a bare ``pip install slr-core`` (and the core's own
tests) has them.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Literal, overload

import pluggy
import structlog
from attrs import field, frozen

from slr import hookspecs
from slr import log as slr_log
from slr.errors import PluginError, UnknownPluginError, UsageError

if TYPE_CHECKING:
    from slr.config import Config
    from slr.contracts import AgentAdapter, Engine, Optimizer, SandboxBackend, Verifier
    from slr.preflight import Check, CheckFn, Stage

ENTRY_POINT_GROUP = "slr"
#: Plugin modules inside slr-core, registered by every manager before the entry points:
#: what every installation (and the core's own tests) needs, with no other distribution.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "slr.agents.plugin",
    "slr.proxy.plugin",
    "slr.preflight.core_checks",
    "slr.preflight.runtime_checks",
    "slr.preflight.sandbox_checks",
    "slr.metrics.plugin",
)
CORE_DISTRIBUTION = "slr-core"


@frozen(kw_only=True)
class Kind:
    """One kind of pluggable thing: its hook, the word people use, its distribution prefix."""

    key: str
    hook: str
    noun: str
    dist_prefix: str


KINDS: dict[str, Kind] = {
    k.key: k
    for k in (
        Kind(key="agent", hook="register_agents", noun="agent", dist_prefix="slr-adapter-"),
        Kind(
            key="sandbox_backend",
            hook="register_sandbox_backends",
            noun="sandbox backend",
            dist_prefix="slr-backend-",
        ),
        Kind(
            key="verifier", hook="register_verifiers", noun="verifier", dist_prefix="slr-verifier-"
        ),
        Kind(
            key="optimizer",
            hook="register_optimizers",
            noun="optimizer",
            dist_prefix="slr-optimizer-",
        ),
        Kind(key="engine", hook="register_engines", noun="engine", dist_prefix="slr-engine-"),
        Kind(
            key="tool_parser",
            hook="register_tool_parsers",
            noun="tool parser",
            dist_prefix="slr-toolparsers-",
        ),
        Kind(key="logger", hook="register_loggers", noun="logger", dist_prefix="slr-logger-"),
    )
}


@frozen(kw_only=True)
class PluginInfo:
    """A loaded plugin: its name (the entry point's), and the distribution that shipped it."""

    name: str
    distribution: str | None = None
    version: str | None = None

    def describe(self) -> str:
        if self.distribution is None:
            return f"plugin {self.name!r} (registered in-process)"
        return f"{self.distribution} {self.version} (plugin {self.name!r})"


@frozen(kw_only=True)
class Registration:
    """One registered thing. ``factory`` is a callable or a lazy ``"module:attr"`` string."""

    kind: str
    name: str
    factory: Callable[..., Any] | str = field(repr=False)
    config_cls: type | None = None
    plugin: PluginInfo

    def load(self) -> Callable[..., Any]:
        """The factory itself, importing its module now if it was given as a string."""
        if not isinstance(self.factory, str):
            return self.factory
        module_name, _, attr = self.factory.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split(".") if attr else ():
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise PluginError(
                f"{KINDS[self.kind].noun} {self.name!r} from {self.plugin.describe()} points at "
                f"{self.factory!r}, which cannot be loaded: {exc}. Reinstall that distribution, "
                f"or uninstall it if you do not need it."
            ) from exc
        # its SDK may have just installed logging handlers of its own (transformers does)
        slr_log.capture_stdlib()
        return obj

    def create(self, options: Any = None, *, config: Any = None, **kwargs: Any) -> Any:
        """Build the thing: ``factory.from_config(config, **kwargs)`` when the factory has a
        ``from_config`` and a whole run config is given (for plugins that need more than their
        own section, e.g. an optimizer needs ``[algorithm]``); otherwise
        ``factory(options, **kwargs)``, or ``factory(**kwargs)`` with no ``config_cls``."""
        factory = self.load()
        from_config = getattr(factory, "from_config", None)
        if config is not None and callable(from_config):
            return from_config(config, **kwargs)
        if self.config_cls is None:
            return factory(**kwargs)
        return factory(options, **kwargs)


def _allowlist() -> set[str] | None:
    raw = os.environ.get("SLR_LOAD_PLUGINS")
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


class PluginManager:
    """pluggy's manager plus the registries filled by the ``register_<kind>s`` hooks."""

    def __init__(self, *, load_entry_points: bool = True, load_builtins: bool = True) -> None:
        self.pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._registries: dict[str, dict[str, Registration]] | None = None
        if load_builtins:
            self._load_builtins()
        if load_entry_points:
            self._load_entry_points()

    def _load_builtins(self) -> None:
        # Not subject to SLR_LOAD_PLUGINS: they are part of the core, like its commands.
        from slr import __version__

        for module_name in BUILTIN_PLUGINS:
            self.register_plugin(
                importlib.import_module(module_name),
                name=module_name,
                distribution=CORE_DISTRIBUTION,
                version=__version__,
            )

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.pm.hook

    def emit(self, hook: str, **kwargs: object) -> None:
        """Fire an event hook (``on_<event>``). Event hooks never stop a run: a failing
        implementation (a logger, a dashboard) is logged and skipped."""
        try:
            getattr(self.pm.hook, hook)(**kwargs)
        except Exception:
            structlog.get_logger().exception("event hook failed", hook=hook)

    def _load_entry_points(self) -> None:
        allow = _allowlist()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist
            dist_name = dist.name if dist is not None else None
            if allow is not None and ep.name not in allow and dist_name not in allow:
                continue
            try:
                module = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {ep.name!r} from {dist_name} could not be imported ({ep.value}): "
                    f"{type(exc).__name__}: {exc}. Reinstall it, or exclude it with "
                    f"SLR_LOAD_PLUGINS=<comma-separated names>."
                ) from exc
            self.register_plugin(
                module,
                name=ep.name,
                distribution=dist_name,
                version=dist.version if dist is not None else None,
            )

    def register_plugin(
        self,
        plugin: object,
        *,
        name: str,
        distribution: str | None = None,
        version: str | None = None,
    ) -> PluginInfo:
        """Register a module or object of hook implementations. Misspelled hooks fail here."""
        if self.pm.has_plugin(name):
            raise PluginError(
                f"two plugins are named {name!r}: {self.plugins[name].describe()} and "
                f"{distribution or 'an in-process plugin'}. Uninstall one of them."
            )
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} ({distribution}) is invalid: {exc}") from exc
        info = PluginInfo(name=name, distribution=distribution, version=version)
        self.plugins[name] = info
        self._check_hook_names(name, plugin, info)
        self._registries = None
        return info

    def unregister_plugin(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.plugins.pop(name, None)
        self._registries = None

    def _check_hook_names(self, name: str, plugin: object, info: PluginInfo) -> None:
        known = {n for n, caller in vars(self.pm.hook).items() if caller.spec is not None}
        for attr in dir(plugin):
            impl = self.pm.parse_hookimpl_opts(plugin, attr)
            if impl is None or attr in known:
                continue
            self.pm.unregister(name=name)
            self.plugins.pop(name, None)
            close = difflib.get_close_matches(attr, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"{info.describe()} implements {attr!r}, which is not an slr hook.{hint} "
                f"The hooks are listed in docs/plugins/hooks.md."
            )

    # -- registries ---------------------------------------------------------------------

    def _collect(self) -> dict[str, dict[str, Registration]]:
        registries: dict[str, dict[str, Registration]] = {key: {} for key in KINDS}
        for kind in KINDS.values():
            caller = getattr(self.pm.hook, kind.hook)
            # Call each implementation on its own so every registration is attributed to the
            # plugin that made it (pluggy's fan-out call would lose that).
            for impl in reversed(caller.get_hookimpls()):
                info = self.plugins.get(impl.plugin_name) or PluginInfo(name=impl.plugin_name)
                register = _Registrar(kind.key, info, registries[kind.key])
                impl.function(**{arg: register for arg in impl.argnames})
        return registries

    def registry(self, kind: str) -> dict[str, Registration]:
        if kind not in KINDS:
            raise KeyError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")
        if self._registries is None:
            self._registries = self._collect()
        return self._registries[kind]

    def preflight_checks(self) -> list[Check]:
        """Every check registered through ``register_preflight_checks``, attributed to its
        plugin: the core's first, then the entry points' in load order."""
        from slr.preflight import STAGES, Check

        checks: list[Check] = []
        for impl in self.pm.hook.register_preflight_checks.get_hookimpls():

            def register(
                name: str, check: CheckFn, *, stage: Stage = "config", _plugin=impl.plugin_name
            ) -> None:
                if stage not in STAGES:
                    raise PluginError(
                        f"plugin {_plugin!r} registered preflight check {name!r} with stage "
                        f"{stage!r}; stages: {', '.join(STAGES)}"
                    )
                checks.append(Check(name=name, fn=check, stage=stage, plugin=_plugin))

            impl.function(**{arg: register for arg in impl.argnames})
        return checks

    @overload
    def build(self, config: Config, section: Literal["engine"]) -> Engine: ...
    @overload
    def build(self, config: Config, section: Literal["optimizer"]) -> Optimizer: ...
    @overload
    def build(self, config: Config, section: Literal["backend"]) -> SandboxBackend: ...
    @overload
    def build(self, config: Config, section: Literal["agent"]) -> AgentAdapter: ...
    @overload
    def build(self, config: Config, section: Literal["verifier"]) -> Verifier: ...
    def build(self, config: Config, section: str) -> Any:
        """The plugin the config's ``[section]`` names, built in this process with its
        options: the one way every command, actor and check builds a run's parts. (An
        engine of ``[run] engine_replicas`` Ray actors is ``slr.cluster.engines.build_engine``'s:
        each actor builds its plugin here.)"""
        from slr.config import PLUGIN_SECTIONS

        choice = getattr(config, section)
        return self.get(PLUGIN_SECTIONS[section], choice.name).create(choice.options, config=config)

    def get(self, kind: str, name: str) -> Registration:
        """The registration of ``name``, or an error listing what is installed."""
        registry = self.registry(kind)
        if name in registry:
            return registry[name]
        k = KINDS[kind]
        installed = ", ".join(sorted(registry)) or "none"
        close = difflib.get_close_matches(name, list(registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownPluginError(
            f"unknown {k.noun} {name!r}.{hint} Installed {k.noun}s: {installed}. "
            f"To add it: pip install {k.dist_prefix}{name}"
        )


class _Registrar:
    """The ``register`` callback handed to one plugin's registration hook."""

    def __init__(self, kind: str, plugin: PluginInfo, into: dict[str, Registration]) -> None:
        self.kind, self.plugin, self.into = kind, plugin, into

    def __call__(
        self, name: str, factory: Callable[..., Any] | str, *, config_cls: type | None = None
    ) -> None:
        noun = KINDS[self.kind].noun
        if not isinstance(name, str) or not name:
            raise PluginError(f"{self.plugin.describe()} registered a {noun} with no name")
        if isinstance(factory, str) and ":" not in factory:
            raise PluginError(
                f"{self.plugin.describe()} registered {noun} {name!r} with factory {factory!r}; "
                f"a string factory must look like 'package.module:Class'"
            )
        if name in self.into:
            other = self.into[name].plugin
            raise PluginError(
                f"{noun} {name!r} is registered twice: by {other.describe()} and by "
                f"{self.plugin.describe()}. Uninstall one of them, or load only one with "
                f"SLR_LOAD_PLUGINS."
            )
        self.into[name] = Registration(
            kind=self.kind, name=name, factory=factory, config_cls=config_cls, plugin=self.plugin
        )


_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager; entry points are loaded on first use, once."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager


def make_plugin(kind: str, name: str, options: tuple[str, ...] = ()) -> Any:
    """An instance of plugin ``name`` with its config class's defaults plus ``KEY=VALUE``s:
    a part built outside a run config (``slr check-tasks``, ``slr data validate``)."""
    from slr.config import parse_set
    from slr.config.structure import structure

    reg = get_plugin_manager().get(kind, name)
    raw: dict[str, object] = {}
    for item in options:
        keys, value = parse_set(item)
        raw[".".join(keys)] = value
    if reg.config_cls is None:
        if raw:
            raise UsageError(f"{kind} {name!r} takes no options, got {', '.join(raw)}")
        return reg.create()
    return reg.create(structure(raw, reg.config_cls, path=name))


def set_plugin_manager(manager: PluginManager | None) -> None:
    """Replace the process-wide manager (tests; ``None`` makes the next call reload)."""
    global _manager
    _manager = manager
