"""LoRA through verl's own options (model.lora_rank, lora_alpha, target_modules): verl's
engine trains only the adapter, the reference for the KL loss is the actor with its adapter
disabled (verl's ref_in_actor), only the adapter leaves the trainer (a WeightUpdate of kind
"lora", as the torch optimizer's), and a checkpoint holds the adapter alone (verl's
save_lora_only plus a peft adapter folder as the servable weights) and restores it exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_verl import checkpoint
from slr_optimizer_verl.config import VerlOptimizerConfig
from slr_optimizer_verl.testing import agreement_trials

from slr.config import AlgorithmSection
from slr.engines.lora import is_adapter_folder, read_adapter
from slr.errors import UsageError
from slr.run import checkpoints

VOCAB = 49152


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lora_trains_and_exports_only_the_adapter_and_round_trips(tiny_model_dir, tmp_path):
    from slr_optimizer_verl.optimizer import VerlOptimizer

    trials = agreement_trials(VOCAB, seed=1)
    opt = VerlOptimizer(
        VerlOptimizerConfig(
            model=str(tiny_model_dir),
            device="cpu",
            lr=1e-2,
            lora_rank=4,
            lora_alpha=8.0,
            target_modules=["q_proj", "v_proj"],
        ),
        algorithm=AlgorithmSection(use_kl_loss=True),
        temperature=1.0,
    )
    try:
        assert opt.ref is None, "with LoRA the reference is the actor without its adapter"
        assert opt.lora is not None and opt.lora.rank == 4 and opt.lora.alpha == 8.0
        assert sorted(opt.lora.modules) == [
            f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")
        ]
        tb = batching.assemble(trials)
        before = opt.logprobs(tb)
        metrics = opt.step(trials)
        assert metrics["optimizer/updates"] == 1.0 and metrics["actor/grad_norm"] > 0
        after = opt.logprobs(tb)
        assert float((after - before).abs().max()) > 1e-3, "the adapter moved nothing"
        # the reference is the frozen base: the adapter disabled gives the initial policy
        torch.testing.assert_close(opt.ref_logprobs(tb), before, rtol=0, atol=1e-6)

        update = opt.export_weights()
        assert update.kind == "lora" and update.lora == opt.lora
        assert sorted(update) == sorted(
            f"{m}.lora_{ab}.weight" for m in opt.lora.modules for ab in "AB"
        )
        assert all(".lora_" in name for name in update)
        saved = {k: v.clone() for k, v in update.items()}
        assert any(float(v.abs().max()) > 0 for k, v in saved.items() if "lora_B" in k)

        run = tmp_path / "run"
        folder = checkpoints.write_checkpoint(
            run, 1, save=opt.save, metrics=metrics, servable_weights=opt.servable_weights
        )
        served = opt.servable_weights(folder)
        assert is_adapter_folder(served)
        adapter = read_adapter(served)
        assert adapter.lora is not None and adapter.lora.rank == 4
        for name, tensor in saved.items():
            torch.testing.assert_close(adapter[name], tensor, rtol=0, atol=0)

        opt.step(agreement_trials(VOCAB, seed=2))
        assert float((opt.logprobs(tb) - after).abs().max()) > 1e-4
        opt.load(checkpoints.latest_checkpoint(run))
        assert (opt.steps, opt.updates) == (1, 1)
        torch.testing.assert_close(opt.logprobs(tb), after, rtol=0, atol=1e-6)
        for name, tensor in opt.export_weights().items():
            torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0)
    finally:
        opt.close()


def test_a_checkpoint_of_the_other_kind_is_refused_before_anything_loads(tmp_path):
    folder = tmp_path / "step-000001"
    (folder / checkpoint.VERL).mkdir(parents=True)
    (folder / checkpoint.STATE).write_text("{}")
    (folder / checkpoints.COMPLETE).write_text("step 1\n")
    # a full-weight checkpoint (no adapter/) into a LoRA optimizer, and the other way round
    lora_opt = SimpleNamespace(lora=object(), critic=None)
    with pytest.raises(UsageError, match="written without a LoRA adapter"):
        checkpoint.load(lora_opt, folder)
    (folder / checkpoint.ADAPTER).mkdir()
    (folder / checkpoint.ADAPTER / "adapter_config.json").write_text("{}")
    full_opt = SimpleNamespace(lora=None, critic=None)
    with pytest.raises(UsageError, match="written with a LoRA adapter"):
        checkpoint.load(full_opt, folder)
    gae_opt = SimpleNamespace(lora=object(), critic=object())
    with pytest.raises(UsageError, match="no critic"):
        checkpoint.load(gae_opt, folder)
