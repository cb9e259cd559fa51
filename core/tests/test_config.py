"""The config tree: defaults, overrides, plugin sections, and errors that name the fix."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import pytest
from attrs import frozen, validators

from slr import hookimpl
from slr.config import CORE_SECTIONS, PluginChoice, load_config, option, parse_set
from slr.config.docs import render_reference
from slr.errors import ConfigError, UnknownPluginError
from slr.plugins import PluginManager

ROOT = Path(__file__).resolve().parents[2]


@frozen(kw_only=True)
class EngineOpts:
    model: str = option("tiny", doc="Model to serve.")
    max_batch: int = option(8, doc="Batch size.", validator=validators.ge(1))


class Defaults:
    """One plugin registering the default name of every plugin section."""

    @hookimpl
    def register_agents(self, register):
        register("mini-swe-agent", dict)
        register("opencode", dict)

    @hookimpl
    def register_sandbox_backends(self, register):
        register("local", dict)
        register("docker", dict)

    @hookimpl
    def register_engines(self, register):
        register("hf", dict, config_cls=EngineOpts)

    @hookimpl
    def register_optimizers(self, register):
        register("torch", dict)

    @hookimpl
    def register_verifiers(self, register):
        register("harbor", dict)


@pytest.fixture
def plugins():
    # Only the fakes: installed plugins (slr-engine-hf, slr-optimizer-torch, ...) register the
    # same default names, which would be a duplicate-registration error.
    manager = PluginManager(load_entry_points=False, load_builtins=False)
    manager.register_plugin(Defaults(), name="defaults", distribution="slr-defaults")
    return manager


def test_defaults_resolve(plugins):
    cfg = load_config(plugins=plugins)
    assert cfg.agent == PluginChoice(name="mini-swe-agent")
    assert cfg.engine.options == EngineOpts()
    assert cfg.rollout.n_per_task == 4
    assert cfg.run.runs_dir == Path("runs")


def test_file_choices_and_sets_override_in_order(plugins, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[agent]\nname = "opencode"\n[engine]\nmax_batch = 2\n[rollout]\nn_per_task = 8\n'
    )
    cfg = load_config(
        path,
        plugins=plugins,
        choose={"backend": "docker", "agent": None},
        sets=["rollout.n_per_task=16", "engine.model=big", "run.name=exp 1"],
    )
    assert cfg.agent.name == "opencode"
    assert cfg.backend.name == "docker"
    assert cfg.engine.options == EngineOpts(model="big", max_batch=2)
    assert cfg.rollout.n_per_task == 16
    assert cfg.run.name == "exp 1"


def test_resolved_config_round_trips_through_toml(plugins, tmp_path):
    cfg = load_config(plugins=plugins, sets=["rollout.temperature=0.7"])
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    assert load_config(path, plugins=plugins) == cfg


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            ["rollout.n_per_tsk=3"],
            "unknown config key rollout.'n_per_tsk'.*Did you mean 'n_per_task'",
        ),
        (["rollout.n_per_task=zero"], r"rollout.n_per_task = 'zero' is not valid: expected int"),
        (["rollout.n_per_task=0"], r"invalid config in \[rollout\].*n_per_task"),
        (["rollout.temperature=true"], "rollout.temperature = True is not valid: expected float"),
        (
            ["proxy.on_history_rewrite=rewrite"],
            "proxy.on_history_rewrite = 'rewrite' is not allowed.*'new_segment', 'recompute'",
        ),
        (["engine.max_batch=0"], r"invalid config in \[engine\].*max_batch"),
        (["engine.modle=x"], "unknown config key engine.'modle'.*Did you mean 'model'"),
        (["agent.step_limit=3"], "agent 'mini-swe-agent' takes no options.*step_limit"),
        (["rollouts.n=1"], "unknown config section 'rollouts'.*Did you mean 'rollout'"),
        (["novalue"], "must look like section.key=value"),
        (["rollout=3"], r"\[rollout\] = 3 is not valid|rollout = 3 is not valid"),
    ],
)
def test_bad_values_fail_naming_key_value_and_allowed(plugins, sets, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(plugins=plugins, sets=sets)


def test_unknown_plugin_in_config_lists_installed(plugins):
    with pytest.raises(UnknownPluginError, match="Installed agents: mini-swe-agent, opencode"):
        load_config(plugins=plugins, choose={"agent": "nope"})


def test_bad_toml_and_missing_file_are_clear(plugins, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nname=1")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(bad, plugins=plugins)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", plugins=plugins)


def test_parse_set_reads_toml_values_else_strings():
    assert parse_set("a.b=3") == (["a", "b"], 3)
    assert parse_set("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_set("a=hello world") == (["a"], "hello world")
    assert parse_set('a="quoted"') == (["a"], "quoted")


def test_every_core_field_is_documented():
    for section, cls in CORE_SECTIONS.items():
        for f in attrs.fields(cls):
            assert f.metadata.get("doc"), f"[{section}] {f.name} has no doc"


def test_reference_page_is_current():
    page = ROOT / "docs" / "reference" / "config.md"
    assert page.read_text() == render_reference(), (
        "docs/reference/config.md is stale: run `slr config reference > docs/reference/config.md`"
    )


def test_only_plugins_validates_just_the_sections_a_command_needs():
    manager = PluginManager(load_entry_points=False, load_builtins=False)
    manager.register_plugin(Defaults(), name="defaults", distribution="slr-defaults")
    cfg = load_config(
        plugins=manager,
        choose={"agent": "not-installed"},
        sets=["engine.max_batch=3"],
        only_plugins=("engine",),
    )
    assert cfg.agent.name == "not-installed"
    assert cfg.engine.options == EngineOpts(max_batch=3)
    with pytest.raises(ConfigError, match="max_batch"):
        load_config(plugins=manager, sets=["engine.max_batch=0"], only_plugins=("engine",))


@pytest.mark.parametrize(
    "run",
    [
        {"engine_replicas": 2},
        {"rollout_workers": 1},
        {"trainer_resources": {"CPU": 1}},
        {"ray_address": "auto"},
    ],
)
def test_a_config_that_puts_roles_on_ray_is_refused_when_ray_is_not_installed(
    plugins, monkeypatch, run
):
    """Ray is the extra slr-core[cluster]: without it such a run would start and fail at the
    first actor; it is refused at load, naming the settings and the install."""
    assert load_config(plugins=plugins, data={"run": dict(run)}).run.ray_settings()
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError) as exc:
        load_config(plugins=plugins, data={"run": dict(run)})
    (setting,) = run
    assert f"{setting} = " in str(exc.value), exc.value
    assert "pip install 'slr-core[cluster]'" in str(exc.value)
    # a run in one process needs no Ray
    assert load_config(plugins=plugins, data={"run": {"steps": 2}}).run.ray_settings() == []


def test_connecting_to_ray_without_it_names_the_extra(monkeypatch):
    from slr.cluster import ray_runtime
    from slr.errors import UsageError

    monkeypatch.setitem(sys.modules, "ray", None)
    assert not ray_runtime.ray_installed()
    with pytest.raises(UsageError, match=r"slr-core\[cluster\]"):
        ray_runtime.connect("local")
