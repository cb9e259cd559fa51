"""The verl optimizer at world size 2: two ranks of verl's TrainingWorker as Ray actors
(gloo, fp32, FSDP over both), on a tiny random Llama with SmolLM2's vocabulary.

- one GRPO step agrees with world size 1 and with slr-optimizer-torch on the same batch
  (loss, gradient norm, log-probs after the update, within 1e-4 relative); the batch has an
  odd number of rows, so one rank also gets a filler row;
- the group's lifecycle: bounded weight buckets gathered across the ranks, a checkpoint
  through verl's manager on both ranks that restores exactly, a servable folder whose
  config says the dtype its tensors have;
- a rank killed between calls surfaces as ``RankFailed`` naming it, not a hang.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_verl.config import VerlOptimizerConfig
from slr_optimizer_verl.testing import agreement_trials

from slr.config import AlgorithmSection
from slr.run import checkpoints

TOLERANCE = 1e-4
# A hang guard, not a speed check: ~35 s each on an idle 2-core machine, but past 240 s in a CI
# run where the suite's other workers (and their own simulated Ray clusters) shared the cores.
HANG = 600


@pytest.fixture(scope="module")
def local_ray(ray_cluster):
    """The session's simulated Ray cluster (``slr_testkit``) with one more node that has room
    for both ranks (2 CPUs): the ranks are packed on one node, and the cluster's own nodes
    have 1 CPU each. Yields that node's id; the node goes again after this module."""
    from slr.cluster.ray_runtime import LOOPBACK

    node = ray_cluster.cluster.add_node(
        num_cpus=2, node_ip_address=LOOPBACK, object_store_memory=200 * 1024 * 1024
    )
    ray_cluster.cluster.wait_for_nodes()
    yield node.node_id
    ray_cluster.cluster.remove_node(node)


@pytest.mark.slow
@pytest.mark.timeout(HANG)
def test_one_grpo_step_at_world_size_2_agrees_with_1_and_torch(tiny_model_dir, local_ray):
    from slr_optimizer_verl.testing import compare

    trials = agreement_trials(49152)[:5]  # 5 rows: one rank also gets a filler row
    out = compare(
        str(tiny_model_dir),
        trials,
        algorithm=AlgorithmSection(adv_estimator="grpo", policy_loss="vanilla"),
        temperature=0.8,
        world_sizes=(1, 2),
    )
    assert abs(out["torch_loss"]) > 1e-3, ("a batch whose loss is ~0 compares nothing", out)
    for name in ("loss_rel", "grad_norm_rel", "logprobs_rel_max"):
        assert out[name] <= TOLERANCE, out
        assert out["ws2"]["vs_torch"][name] <= TOLERANCE, out
        assert out["ws2"]["vs_ws1"][name] <= TOLERANCE, out


@pytest.mark.slow
@pytest.mark.timeout(HANG)
def test_world_size_2_buckets_checkpoint_served_dtype_and_a_killed_rank(
    tiny_model_dir, tmp_path, local_ray
):
    from slr_optimizer_verl.optimizer import VerlOptimizer
    from slr_optimizer_verl.ray_group import RankFailed, RayGroup
    from transformers import AutoConfig, AutoModelForCausalLM

    trials = agreement_trials(49152, seed=1)
    opt = VerlOptimizer(
        VerlOptimizerConfig(model=str(tiny_model_dir), device="cpu", lr=1e-2, world_size=2),
        algorithm=AlgorithmSection(),
        temperature=1.0,
    )
    try:
        assert isinstance(opt.group, RayGroup)
        ranks = opt.group.ranks
        assert [r["rank"] for r in ranks] == [0, 1]
        assert len({r["pid"] for r in ranks} | {os.getpid()}) == 3  # a process per rank
        assert {r["node_id"] for r in ranks} == {local_ray}  # packed on the node with room
        tb = batching.assemble(trials)
        before = opt.logprobs(tb)
        metrics = opt.step(trials)
        assert metrics["optimizer/updates"] == 1.0 and metrics["actor/grad_norm"] > 0
        after = opt.logprobs(tb)
        assert float((after - before).abs().max()) > 1e-4, "the update moved nothing"

        # weights: bounded buckets gathered over both ranks, equal to the lazy mapping
        exported = opt.export_weights()
        names = list(exported)
        limit = 64 * 1024
        seen = []
        for bucket in opt.weight_buckets(limit):
            nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
            assert nbytes <= limit or len(bucket) == 1
            for name, tensor in bucket:
                assert tensor.dtype == torch.float32
                seen.append((name, tensor))
        assert [n for n, _ in seen] == names
        saved = dict(seen)
        some = names[len(names) // 2]
        assert torch.equal(exported[some], saved[some])

        # a checkpoint through verl's manager on both ranks
        run = tmp_path / "run"
        folder = checkpoints.write_checkpoint(
            run, 1, save=opt.save, metrics=metrics, servable_weights=opt.servable_weights
        )
        verl_dir = folder / "verl"
        assert (verl_dir / "model_world_size_2_rank_0.pt").is_file()
        assert (verl_dir / "model_world_size_2_rank_1.pt").is_file()
        served = opt.servable_weights(folder)
        assert AutoConfig.from_pretrained(served).dtype == torch.float32
        model = AutoModelForCausalLM.from_pretrained(served)  # the dtype its config says
        state = model.state_dict()
        for name in names:
            assert state[name].dtype == torch.float32
            torch.testing.assert_close(state[name], saved[name], rtol=0, atol=0)

        opt.step(agreement_trials(49152, seed=2))
        assert float((opt.logprobs(tb) - after).abs().max()) > 1e-4
        opt.load(checkpoints.latest_checkpoint(run))
        assert opt.steps == 1 and opt.updates == 1
        torch.testing.assert_close(opt.logprobs(tb), after, rtol=0, atol=1e-6)

        # a rank that dies: the next call names it and stops the group, it does not hang
        os.kill(ranks[1]["pid"], signal.SIGKILL)
        with pytest.raises(RankFailed, match="rank 1 of the verl optimizer's 2 ranks") as caught:
            opt.step(trials)
        assert "\n" not in str(caught.value)
        with pytest.raises(RuntimeError, match="closed"):
            opt.logprobs(tb)
    finally:
        opt.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_more_ranks_than_a_node_holds_is_refused_before_any_starts(tiny_model_dir, local_ray):
    from slr_optimizer_verl.optimizer import VerlOptimizer

    from slr.errors import UsageError

    with pytest.raises(UsageError, match="optimizer.world_size = 64 puts its ranks on one Ray"):
        VerlOptimizer(
            VerlOptimizerConfig(model=str(tiny_model_dir), device="cpu", world_size=64),
            algorithm=AlgorithmSection(),
            temperature=1.0,
        )
