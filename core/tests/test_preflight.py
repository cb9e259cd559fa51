"""The preflight: its runner, the core's checks (each class tripped and passed), and the
hook through which any plugin adds checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from slr import hookimpl
from slr.config import load_config
from slr.errors import SlrError
from slr.plugins import BUILTIN_PLUGINS, get_plugin_manager
from slr.preflight import (
    CheckResult,
    Context,
    PreflightFailed,
    fatal,
    ok,
    require,
    run_checks,
    run_preflight,
    warn,
)
from slr.preflight import core_checks as preflight_checks

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"


def config(tmp_path, *sets: str, **choose):
    choose = {"agent": "nop", "backend": "local", **choose}
    return load_config(
        plugins=get_plugin_manager(),
        choose=choose,
        sets=[
            f'run.runs_dir="{tmp_path / "runs"}"',
            f'tasks.path="{TASKS}"',
            "rollout.concurrency=2",
            *sets,
        ],
    )


def lines(report, check: str) -> list[CheckResult]:
    return [line.result for line in report.lines if line.check == check]


def statuses(report, check: str) -> set[str]:
    return {r.status for r in lines(report, check)}


def core(cfg, purpose="run"):
    """The core's own checks, every stage (the plugins' checks have tests of their own)."""
    plugins = get_plugin_manager()
    checks = [c for c in plugins.preflight_checks() if c.plugin in BUILTIN_PLUGINS]
    return run_checks(checks, Context(config=cfg, plugins=plugins, purpose=purpose))


def structure(tmp_path, *sets, purpose="run", **choose):
    return run_preflight(
        config(tmp_path, *sets, **choose),
        get_plugin_manager(),
        purpose=purpose,
        structure_only=True,
    )


# -- config: plugins and versions ------------------------------------------------------------


def test_installed_plugins_pass_with_their_versions(tmp_path):
    report = structure(tmp_path)
    results = lines(report, "plugins")
    assert {r.status for r in results} == {"pass"}
    assert any("slr-backend-local 0.1.0" in r.message for r in results)


class _Broken:
    @hookimpl
    def register_sandbox_backends(self, register):
        register("broken", "slr_no_such_module.backend:Backend")


def test_a_plugin_whose_module_is_not_installed_is_fatal(tmp_path, slr_plugins):
    slr_plugins.register(_Broken(), name="broken", distribution="slr-backend-broken")
    report = structure(tmp_path, backend="broken")
    [result] = [r for r in lines(report, "plugins") if r.status == "fatal"]
    assert "slr_no_such_module.backend" in result.message
    assert "reinstall slr-backend-broken" in result.fix
    assert not report.ok


def test_a_plugin_built_for_another_slr_core_is_fatal(tmp_path, slr_plugins, monkeypatch):
    # A real installed distribution (its metadata on sys.path) that needs a newer slr-core.
    info = tmp_path / "site" / "slr_backend_future-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: slr-backend-future\nVersion: 1.0\n"
        "Requires-Dist: slr-core>=99\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))

    class Future:
        @hookimpl
        def register_sandbox_backends(self, register):
            register("future", "slr_backend_local.backend:LocalBackend")

    slr_plugins.register(Future(), name="future", distribution="slr-backend-future")
    report = structure(tmp_path, backend="future")
    [result] = [r for r in lines(report, "plugins") if r.status == "fatal"]
    assert "needs slr-core>=99" in result.message
    assert "pip install -U slr-backend-future" in result.fix


# -- config: silent pitfalls -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("rollout.n_per_task=1", "n_per_task = 1"),
        ("rollout.temperature=0.0", "temperature = 0"),
        ('proxy.client_sampling="honor"', "client_sampling = 'honor'"),
    ],
)
def test_training_pitfalls_are_fatal(tmp_path, setting, needle):
    report = structure(tmp_path, setting)
    [result] = [r for r in lines(report, "pitfalls") if r.status == "fatal"]
    assert needle in result.message and result.fix
    assert result.doc.startswith("docs/troubleshooting/")


def test_the_same_settings_are_fine_for_an_eval(tmp_path):
    report = structure(tmp_path, "rollout.n_per_task=1", "rollout.temperature=0.0", purpose="eval")
    assert report.ok, [line.text() for line in report.fatal]


def test_a_default_training_config_has_no_pitfall(tmp_path):
    assert statuses(structure(tmp_path), "pitfalls") == {"pass"}


def trained_run(tmp_path: Path, temperature: float | None) -> Path:
    """A run folder as training leaves it: its config and one checkpoint folder."""
    run = tmp_path / "runs" / "trained-1"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    rollout = "" if temperature is None else f"temperature = {temperature}\n"
    (run / "config.toml").write_text(f'[run]\nname = "trained"\n[rollout]\n{rollout}')
    return run


def eval_of(tmp_path, checkpoint: Path, *sets: str):
    return run_preflight(
        config(tmp_path, *sets),
        get_plugin_manager(),
        purpose="eval",
        structure_only=True,
        checkpoint=checkpoint,
    )


def test_an_eval_at_another_temperature_than_training_warns(tmp_path):
    run = trained_run(tmp_path, 1.0)
    for given in (run, run / "checkpoints" / "step-000002"):  # the run, or one checkpoint
        report = eval_of(tmp_path, given, "rollout.temperature=0.6")
        [result] = lines(report, "pitfalls")
        assert result.status == "warn" and report.ok
        assert "rollout.temperature = 0.6" in result.message and "trained at 1" in result.message
        assert "--set rollout.temperature=1" in result.fix
        assert result.doc == "docs/troubleshooting/training.md#eval-disagrees-with-training-reward"


def test_an_eval_at_the_training_temperature_passes(tmp_path):
    # a run config that leaves the temperature at its default trained at the default
    assert statuses(eval_of(tmp_path, trained_run(tmp_path, None)), "pitfalls") == {"pass"}
    assert statuses(eval_of(tmp_path, tmp_path / "not-a-run"), "pitfalls") == {"pass"}


def test_idle_concurrency_warns(tmp_path):
    report = structure(
        tmp_path, "rollout.concurrency=64", "rollout.tasks_per_step=1", "rollout.n_per_task=2"
    )
    assert statuses(report, "pitfalls") == {"warn"}
    assert report.ok


def test_an_unknown_tool_parser_is_fatal(tmp_path):
    report = structure(tmp_path, 'proxy.tool_parser="nonesuch"')
    assert statuses(report, "tool-parser") == {"fatal"}


# -- machine: disk and memory headroom -------------------------------------------------------


def test_headroom_passes_here_and_is_fatal_below_the_floor(tmp_path, monkeypatch):
    cfg = config(tmp_path)
    report = core(cfg)
    assert statuses(report, "disk") == {"pass"}
    assert statuses(report, "memory") <= {"pass", "warn"}
    monkeypatch.setattr(preflight_checks, "DISK_FATAL", 1 << 60)  # more than any disk
    monkeypatch.setattr(preflight_checks, "MEMORY_FATAL", 1 << 60)
    report = core(cfg)
    assert statuses(report, "disk") == {"fatal"}
    assert statuses(report, "memory") == {"fatal"}
    assert report.skipped_stages == ("data",)  # tasks and model are not looked at


# -- data: the task set ----------------------------------------------------------------------


def test_the_task_set_loads(tmp_path):
    report = core(config(tmp_path))
    assert statuses(report, "tasks") == {"pass"}, report.lines


def test_a_missing_task_set_or_task_is_fatal(tmp_path):
    report = core(config(tmp_path, f'tasks.path="{tmp_path}/none"'))
    assert statuses(report, "tasks") == {"fatal"}
    report = core(config(tmp_path, 'tasks.include=["no-such-task"]'))
    [result] = lines(report, "tasks")
    assert result.status == "fatal" and "no-such-task" in result.message


# -- the runner and the hook -----------------------------------------------------------------


class _Checks:
    """A plugin that contributes checks through the hook."""

    @hookimpl
    def register_preflight_checks(self, register):
        register("always-warns", lambda ctx: warn("just so", fix="nothing"), stage="config")
        register("does-not-apply", lambda ctx: None, stage="config")
        register("crashes", _crash, stage="machine")
        register(
            "sees-the-config",
            lambda ctx: ok(f"agent {ctx.config.agent.name} for {ctx.purpose}"),
            stage="config",
        )


def _crash(ctx):
    raise RuntimeError("boom")


def test_plugins_add_checks_and_a_crashing_check_is_a_fatal_line(tmp_path, slr_plugins):
    slr_plugins.register(_Checks(), name="checks", distribution="slr-checks")
    # an eval with a model-free agent: no engine, so no model is loaded
    report = run_preflight(config(tmp_path), get_plugin_manager(), purpose="eval")
    assert statuses(report, "always-warns") == {"warn"}
    assert lines(report, "does-not-apply") == []
    assert lines(report, "sees-the-config")[0].message == "agent nop for eval"
    [crash] = lines(report, "crashes")
    assert crash.status == "fatal" and "RuntimeError: boom" in crash.message
    assert "'checks'" in crash.fix
    with pytest.raises(PreflightFailed) as err:
        require(report)
    assert "crashes: the check itself failed" in str(err.value)
    assert isinstance(err.value, SlrError)


def test_a_check_on_an_unknown_stage_is_refused(slr_plugins):
    class Bad:
        @hookimpl
        def register_preflight_checks(self, register):
            register("x", lambda ctx: None, stage="later")

    slr_plugins.register(Bad(), name="bad")
    with pytest.raises(SlrError, match="stage 'later'"):
        get_plugin_manager().preflight_checks()


def test_a_fatal_always_names_its_fix():
    with pytest.raises(TypeError):
        fatal("no fix given")  # type: ignore[call-arg]
    assert "Fix: do this" in fatal("broken", fix="do this").line("x")
