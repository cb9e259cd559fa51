"""The runtime's config keys and addresses: bad values stop a run before Ray starts."""

from __future__ import annotations

import pytest

from slr.cluster.engines import actor_options
from slr.cluster.ray_runtime import check_address
from slr.config import load_config
from slr.errors import ConfigError, UsageError
from slr.plugins import get_plugin_manager


def run_config(**run):
    return load_config(data={"run": run}, plugins=get_plugin_manager(), only_plugins=())


def test_defaults_keep_the_engine_embedded():
    run = run_config().run
    assert run.engine_replicas == 0 and run.ray_address is None
    assert run.engine_resources == {"CPU": 1.0}
    # the roles stay in the driver unless asked for
    assert run.rollout_workers == 0 and run.trainer_resources is None
    assert run.worker_resources == {"CPU": 1.0}


def test_role_resources_are_read():
    run = run_config(
        rollout_workers=2, worker_resources={"sandbox": 1}, trainer_resources={"GPU": 1}
    ).run
    assert run.rollout_workers == 2 and run.worker_resources == {"sandbox": 1.0}
    assert run.trainer_resources == {"GPU": 1.0}


@pytest.mark.parametrize("address", ["auto", "local", "10.0.0.5:6379", "ray://head:10001"])
def test_ray_addresses_slr_understands(address):
    assert run_config(ray_address=address).run.ray_address == address


@pytest.mark.parametrize(
    ("run", "words"),
    [
        ({"ray_address": "my cluster"}, ["run.ray_address", "'my cluster'", "'auto'"]),
        ({"engine_replicas": -1}, ["engine_replicas", "-1"]),
        ({"engine_resources": {"GPU": -1}}, ["run.engine_resources", "{CPU = 1}"]),
        ({"engine_resources": {"GPU": "one"}}, ["run.engine_resources.GPU", "'one'"]),
        ({"rollout_workers": -1}, ["rollout_workers", "-1"]),
        ({"worker_resources": {"sandbox": -1}}, ["run.worker_resources", "{CPU = 1}"]),
        ({"trainer_resources": {"GPU": -1}}, ["run.trainer_resources", "{CPU = 1}"]),
    ],
)
def test_bad_runtime_keys_name_the_key_and_the_fix(run, words):
    with pytest.raises(ConfigError) as info:
        run_config(**run)
    for word in words:
        assert word in str(info.value)


def test_check_address_is_a_usage_error():
    with pytest.raises(UsageError, match="host:port"):
        check_address("http://nope")


def test_resources_map_to_ray_actor_options():
    assert actor_options({"CPU": 1, "GPU": 1, "engine": 0.5}) == {
        "num_cpus": 1.0,
        "num_gpus": 1.0,
        "resources": {"engine": 0.5},
    }
    assert actor_options({}) == {"num_cpus": 0.0, "num_gpus": 0.0}


def test_rollout_workers_without_engine_replicas_fail_before_ray_starts(tmp_path):
    """A scaffold that calls the model needs the engine out of the driver: the workers'
    proxies reach engine replicas, never the driver."""
    import asyncio
    import sys

    from slr.cluster.workers import start_rollout_workers
    from slr.rollout.recorder import TrialRecorder
    from slr.run.directory import RunDir

    config = run_config(rollout_workers=1, runs_dir=str(tmp_path))
    run = RunDir.create(config.run.runs_dir, "w", config.to_toml())

    class ModelAgent:  # stub: only its needs_model is read
        needs_model = True

    session = TrialRecorder(
        run, plugins=get_plugin_manager(), config=config, agent=ModelAgent(), serve_proxy=False
    )
    ray_loaded = "ray" in sys.modules
    with pytest.raises(UsageError, match=r"set run.engine_replicas >= 1"):
        asyncio.run(start_rollout_workers(config, session, replicas=[], tasks=[]))
    assert ("ray" in sys.modules) == ray_loaded  # nothing started
    run.close()
