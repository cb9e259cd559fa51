"""The verl optimizer's lifecycle on a tiny model: verl's worker starts (gloo, world size 1),
steps, publishes its weights in bounded buckets, saves through verl's checkpoint manager,
restores exactly what it saved after another step moved the weights, serves a folder whose
config says the dtype its tensors have, and on close leaves no process group behind."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from slr_optimizer_torch import batch as batching
from slr_optimizer_verl.config import VerlOptimizerConfig
from slr_optimizer_verl.testing import agreement_trials

from slr.config import AlgorithmSection
from slr.errors import UsageError
from slr.run import checkpoints


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_step_buckets_checkpoint_round_trip_and_close(tiny_model_dir, tmp_path):
    from slr_optimizer_verl.optimizer import VerlOptimizer

    trials = agreement_trials(49152, seed=1)
    opt = VerlOptimizer(
        VerlOptimizerConfig(model=str(tiny_model_dir), device="cpu", lr=1e-2),
        algorithm=AlgorithmSection(),
        temperature=1.0,
    )
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        tb = batching.assemble(trials)
        before = opt.logprobs(tb)
        metrics = opt.step(trials)
        assert metrics["optimizer/updates"] == 1.0 and metrics["actor/grad_norm"] > 0
        after = opt.logprobs(tb)
        assert float((after - before).abs().max()) > 1e-4, "the update moved nothing"

        # weights: bounded buckets, every tensor once, the same values as the mapping
        exported = opt.export_weights()
        names = list(exported)
        limit = 64 * 1024
        seen = []
        for bucket in opt.weight_buckets(limit):
            nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
            assert nbytes <= limit or len(bucket) == 1
            for name, tensor in bucket:
                assert torch.equal(tensor, exported[name])
                seen.append(name)
        assert seen == names and len(names) == len(exported)

        saved = {name: exported[name] for name in names}  # exported reads lazily
        run = tmp_path / "run"
        folder = checkpoints.write_checkpoint(
            run, 1, save=opt.save, metrics=metrics, servable_weights=opt.servable_weights
        )
        opt.step(agreement_trials(49152, seed=2))
        moved = opt.logprobs(tb)
        assert float((moved - after).abs().max()) > 1e-4
        assert opt.steps == 2

        opt.load(checkpoints.latest_checkpoint(run))
        assert opt.steps == 1 and opt.updates == 1
        torch.testing.assert_close(opt.logprobs(tb), after, rtol=0, atol=1e-6)

        # the servable folder is a Hugging Face model holding the saved weights, and its
        # config says their dtype (verl's manager writes bfloat16 there; slr eval serves it
        # with the dtype the config names)
        from transformers import AutoConfig, AutoModelForCausalLM

        assert AutoConfig.from_pretrained(opt.servable_weights(folder)).dtype == torch.float32
        served = AutoModelForCausalLM.from_pretrained(opt.servable_weights(folder))
        state = served.state_dict()
        for name in names:
            assert state[name].dtype == torch.float32, name
            torch.testing.assert_close(state[name], saved[name], rtol=0, atol=0)

        with pytest.raises(UsageError, match="incomplete"):
            opt.load(tmp_path / "nowhere")
    finally:
        opt.close()
    assert not dist.is_initialized()
