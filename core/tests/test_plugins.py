"""The plugin manager: registration, attribution, lazy factories, and errors for people."""

from __future__ import annotations

import sys
import textwrap

import pytest

from slr import hookimpl
from slr.errors import PluginError, UnknownPluginError
from slr.plugins import PluginManager


class AgentsA:
    @hookimpl
    def register_agents(self, register):
        register("alpha", "json:dumps")
        register("beta", dict, config_cls=None)


class AgentsDuplicate:
    @hookimpl
    def register_agents(self, register):
        register("alpha", "json:loads")


def test_registration_records_the_distribution(slr_plugins):
    slr_plugins.register(AgentsA(), name="a", distribution="slr-adapter-alpha")
    reg = slr_plugins.manager.get("agent", "alpha")
    assert reg.plugin.distribution == "slr-adapter-alpha"
    assert reg.plugin.version == "test"
    assert reg.load()([1]) == "[1]"


def test_duplicate_name_names_both_distributions(slr_plugins):
    slr_plugins.register(AgentsA(), name="a", distribution="slr-adapter-alpha")
    slr_plugins.register(AgentsDuplicate(), name="b", distribution="my-alpha-fork")
    with pytest.raises(PluginError) as err:
        slr_plugins.manager.registry("agent")
    msg = str(err.value)
    assert "'alpha' is registered twice" in msg
    assert "slr-adapter-alpha" in msg and "my-alpha-fork" in msg


def test_unknown_name_lists_installed_and_suggests_install(slr_plugins):
    slr_plugins.register(AgentsA(), name="a", distribution="slr-adapter-alpha")
    with pytest.raises(UnknownPluginError) as err:
        slr_plugins.manager.get("agent", "alpah")
    msg = str(err.value)
    assert "Did you mean 'alpha'?" in msg
    assert "alpha, beta" in msg
    assert "pip install slr-adapter-alpah" in msg
    assert err.value.exit_code == 2


def test_unknown_kind_wording_per_kind(slr_plugins):
    with pytest.raises(UnknownPluginError, match="pip install slr-backend-nomad"):
        slr_plugins.manager.get("sandbox_backend", "nomad")
    with pytest.raises(UnknownPluginError, match="pip install slr-engine-tgi"):
        slr_plugins.manager.get("engine", "tgi")


def test_string_factory_is_imported_only_when_loaded(slr_plugins, tmp_path, monkeypatch):
    (tmp_path / "slr_lazy_probe.py").write_text("class Heavy:\n    loaded = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Lazy:
        @hookimpl
        def register_engines(self, register):
            register("lazy", "slr_lazy_probe:Heavy")

    slr_plugins.register(Lazy(), name="lazy")
    reg = slr_plugins.manager.get("engine", "lazy")
    assert "slr_lazy_probe" not in sys.modules
    assert reg.load().loaded is True
    assert "slr_lazy_probe" in sys.modules


def test_factory_that_cannot_import_is_a_clear_error(slr_plugins):
    class Broken:
        @hookimpl
        def register_verifiers(self, register):
            register("broken", "slr_no_such_module_xyz:Verifier")

    slr_plugins.register(Broken(), name="broken", distribution="slr-verifier-broken")
    reg = slr_plugins.manager.get("verifier", "broken")
    with pytest.raises(PluginError, match="slr-verifier-broken.*cannot be loaded"):
        reg.load()


def test_string_factory_without_colon_is_rejected(slr_plugins):
    class Bad:
        @hookimpl
        def register_optimizers(self, register):
            register("bad", "just_a_module")

    slr_plugins.register(Bad(), name="bad")
    with pytest.raises(PluginError, match="must look like 'package.module:Class'"):
        slr_plugins.manager.registry("optimizer")


def test_misspelled_hook_fails_loudly_with_suggestion():
    class Typo:
        @hookimpl
        def register_agent(self, register):  # missing the final "s"
            register("x", dict)

    manager = PluginManager(load_entry_points=False)
    with pytest.raises(PluginError) as err:
        manager.register_plugin(Typo(), name="typo", distribution="slr-adapter-typo")
    assert "'register_agent', which is not an slr hook" in str(err.value)
    assert "Did you mean 'register_agents'?" in str(err.value)
    assert "typo" not in manager.plugins


def test_wrong_hook_arguments_fail_loudly():
    class WrongArgs:
        @hookimpl
        def register_agents(self, registry):
            pass

    manager = PluginManager(load_entry_points=False)
    with pytest.raises(PluginError, match="invalid"):
        manager.register_plugin(WrongArgs(), name="wrong")


def test_same_plugin_name_twice_is_an_error():
    manager = PluginManager(load_entry_points=False)
    manager.register_plugin(AgentsA(), name="a", distribution="one")
    with pytest.raises(PluginError, match="two plugins are named 'a'"):
        manager.register_plugin(AgentsDuplicate(), name="a", distribution="two")


def test_register_commands_adds_a_subcommand(slr_plugins):
    import click
    from click.testing import CliRunner

    class Commands:
        @hookimpl
        def register_commands(self, cli):
            @cli.command()
            def hello():
                click.echo("hello from a plugin")

    slr_plugins.register(Commands(), name="commands")

    @click.group()
    def cli():
        pass

    slr_plugins.manager.hook.register_commands(cli=cli)
    result = CliRunner().invoke(cli, ["hello"])
    assert result.exit_code == 0
    assert result.output == "hello from a plugin\n"


def test_plugin_module_with_hookimpl_functions(tmp_path, monkeypatch):
    (tmp_path / "slr_mod_plugin.py").write_text(
        textwrap.dedent(
            """
            from slr import hookimpl

            @hookimpl
            def register_sandbox_backends(register):
                register("modbackend", "slr_mod_plugin:Backend")

            class Backend:
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import slr_mod_plugin

    manager = PluginManager(load_entry_points=False)
    manager.register_plugin(slr_mod_plugin, name="mod")
    assert manager.get("sandbox_backend", "modbackend").load() is slr_mod_plugin.Backend


def test_create_calls_the_factory_by_convention(slr_plugins):
    from attrs import frozen

    from slr.config import option

    @frozen(kw_only=True)
    class Opts:
        size: int = option(1, doc="size")

    class Plain:
        def __init__(self, options=None, **kw):
            self.options, self.kw = options, kw

    class Whole(Plain):
        @classmethod
        def from_config(cls, config, **kw):
            obj = cls(None, **kw)
            obj.config = config
            return obj

    class Reg:
        @hookimpl
        def register_engines(self, register):
            register("plain", Plain, config_cls=Opts)
            register("bare", Plain)
            register("whole", Whole, config_cls=Opts)

    slr_plugins.register(Reg(), name="reg")
    get = slr_plugins.manager.get
    assert get("engine", "plain").create(Opts(size=3), config="cfg").options == Opts(size=3)
    assert get("engine", "bare").create(None, extra=1).kw == {"extra": 1}
    assert get("engine", "whole").create(Opts(), config="cfg").config == "cfg"
