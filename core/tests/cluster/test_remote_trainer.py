"""The trainer as a Ray actor (slr.cluster.trainer) on the simulated cluster.

The ``torch`` optimizer on a tiny random model, built in its own process; the driver holds a
``RemoteOptimizer``. Weights come back as one object-store reference; checkpoint files come
to the driver, which writes them, and go back to a fresh trainer on resume.
"""

from __future__ import annotations

import os

import pytest

from slr.cluster.trainer import RemoteOptimizer, start_trainer
from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.run import checkpoints
from slr_testkit import tiny

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    model, tok = tiny.tiny_model(seed=0)
    folder = tiny.save(model, tok, tmp_path_factory.mktemp("tiny") / "model")
    data = {
        "run": {"trainer_resources": {"sandbox": 1}},
        "engine": {"name": "hf", "model": str(folder)},
        "optimizer": {"name": "torch"},
    }
    return load_config(
        data=data, plugins=get_plugin_manager(), only_plugins=("optimizer", "engine")
    )


def test_trainer_actor_exports_by_reference_and_checkpoints_through_the_driver(
    ray_cluster, config, tmp_path
):
    import ray
    import torch

    trainer = start_trainer(config, by_reference=True)
    restored: RemoteOptimizer | None = None
    try:
        # placed by its resources ({sandbox = 1}), in a process of its own
        assert trainer.node_id in ray_cluster.node_ids("sandbox")
        assert trainer.pid != os.getpid()
        ref = trainer.export_weights()
        assert isinstance(ref, ray.ObjectRef)  # the tensors stay in the object store
        weights = ray.get(ref)
        assert weights and all(isinstance(v, torch.Tensor) for v in weights.values())

        # the driver writes the checkpoint's files; the trainer's own layout inside it
        trainer.save(tmp_path)
        served = trainer.servable_weights(tmp_path)
        assert served is not None and served.is_dir() and served.parent == tmp_path
        assert any(served.glob("*.safetensors"))

        # a fresh trainer restores from the files the driver sends it
        (tmp_path / checkpoints.COMPLETE).write_text("")  # what write_checkpoint ends with
        restored = start_trainer(config, by_reference=False)
        restored.load(tmp_path)
        again = restored.export_weights()  # by_reference=False: the tensors themselves
        assert not isinstance(again, ray.ObjectRef)
        assert again.keys() == weights.keys()
        assert all(torch.equal(again[k], weights[k]) for k in weights)
    finally:
        trainer.close()
        if restored is not None:
            restored.close()


def test_a_trainer_that_cannot_start_says_why(ray_cluster, config):
    import attrs

    from slr.errors import UsageError

    broken = attrs.evolve(
        config,
        engine=attrs.evolve(config.engine, options=attrs.evolve(config.engine.options, model="")),
    )
    with pytest.raises(UsageError) as info:
        start_trainer(broken, by_reference=True)
    message = str(info.value)
    assert "the trainer asking" in message and "no model to train" in message
    assert "Traceback" not in message and "File " not in message
