"""Tree packing: a session's segments scored as one prefix tree give exactly the copies' scores.

The trial below is a small agent session with the two kinds of branches the proxy records:
a sub-agent forked off the main conversation (``fork``) and a compaction that keeps the
system prompt and replaces the rest (``rewrite``); a second trial of the group shares the
task prompt with it (a plain common prefix, no lineage).
"""

from __future__ import annotations

import attrs
import pytest
import torch
from slr_optimizer_torch import packing
from slr_optimizer_torch.batch import assemble
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import Scorer
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import sample, tiny_causal_lm

from slr.config import AlgorithmSection
from slr.contracts import Reward, Segment, Trajectory, TrialResult

# generous: the first tiny model pays for importing transformers, slow on a loaded machine
pytestmark = pytest.mark.timeout(180)

SYSTEM = [1, 5, 9, 13, 17, 21, 25, 29]  # system prompt and tools, shared by every segment
TASK = [33, 37, 41, 45]


def _turn(model, context, gen, *, new=6) -> tuple[list[int], list[float]]:
    tokens, lps = sample(model, context, n=1, max_new_tokens=new, temperature=1.0, generator=gen)
    return tokens[0].tolist(), lps[0].tolist()


def _session(model, seed: int, *, trial_id: str, reward: float) -> TrialResult:
    """main (2 turns) -> sub-agent fork after turn 1 -> compaction (rewrite) of main."""
    gen = torch.Generator().manual_seed(seed)
    ids, mask, lps = [*SYSTEM, *TASK], [0] * 12, [0.0] * 12
    ends = []  # where each policy turn ends
    for obs in ([50, 51, 52], [53, 54]):
        t, lp = _turn(model, ids, gen)
        ids, mask, lps = ids + t, mask + [1] * len(t), lps + lp
        ends.append(len(ids))
        ids, mask, lps = ids + obs, mask + [0] * len(obs), lps + [0.0] * len(obs)
    fork_at = ends[0]
    main = Segment(token_ids=ids, loss_mask=mask, logprobs=lps)
    # the sub-agent: the main prefix up to turn 1's reply, then its own prompt and reply
    sub_prompt = [*ids[:fork_at], 60, 61, 62]
    t, lp = _turn(model, sub_prompt, gen)
    sub = Segment(
        token_ids=sub_prompt + t,
        loss_mask=[0] * len(sub_prompt) + [1] * len(t),
        logprobs=[0.0] * len(sub_prompt) + lp,
        parent=0,
        branch_at=fork_at,
        branch="fork",
    )
    # compaction: the system prompt stays, a summary replaces the history
    compact = [*SYSTEM, 70, 71, 72, 73]
    t, lp = _turn(model, compact, gen, new=5)
    rewrite = Segment(
        token_ids=compact + t,
        loss_mask=[0] * len(compact) + [1] * len(t),
        logprobs=[0.0] * len(compact) + lp,
        parent=0,
        branch_at=len(SYSTEM),
        branch="rewrite",
    )
    return TrialResult(
        trial_id=trial_id,
        task_id="task",
        group_id="g",
        termination="completed",
        reward=Reward(value=reward),
        trajectory=Trajectory(session_id=trial_id, segments=[main, sub, rewrite]),
    )


@pytest.fixture(scope="module")
def model():
    return tiny_causal_lm(vocab_size=128, init_std=0.3, seed=3)


@pytest.fixture(scope="module")
def trials(model):
    return [
        _session(model, 1, trial_id="a", reward=1.0),
        _session(model, 2, trial_id="b", reward=0.0),
    ]


@torch.no_grad()
def _scores(model, tb, rows, packed):
    length = int(tb.lengths[rows].max())
    return Scorer(model, temperature=1.0)(
        tb.input_ids[rows, :length],
        tb.attention_mask[rows, :length],
        tb.response_mask[rows, : length - 1],
        entropy=True,
        packed=packed,
    )


def test_the_tree_holds_each_shared_prefix_once(trials):
    tb = assemble(trials)
    rows = list(range(tb.num_sequences))
    packed = packing.pack(rows, tb.input_ids, tb.lengths)
    # every distinct prefix once: the tree's size is the number of distinct prefixes
    prefixes = {
        tuple(tb.input_ids[r, : c + 1].tolist()) for r in rows for c in range(int(tb.lengths[r]))
    }
    assert packed.tokens == len(prefixes) == packing.unique_tokens(rows, tb.input_ids, tb.lengths)
    assert packed.tokens < int(tb.lengths.sum())
    for r in rows:  # each row's path reads back its tokens at its own positions
        n = int(tb.lengths[r])
        path = packed.index[r, :n]
        assert packed.input_ids[0, path].tolist() == tb.input_ids[r, :n].tolist()
        assert packed.position_ids[0, path].tolist() == list(range(n))
        # a position sees exactly the earlier positions of its own row
        assert packed.visible[path][:, path].equal(torch.ones(n, n, dtype=torch.bool).tril())
        assert int(packed.visible[path[-1]].sum()) == n


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_log_probs_equal_the_copies_on_forks_and_rewrites(trials, attention):
    model = tiny_causal_lm(vocab_size=128, init_std=0.3, seed=3)
    model.config._attn_implementation = attention
    tb = assemble(trials)
    rows = list(range(tb.num_sequences))
    assert tb.num_sequences == 6
    copies = _scores(model, tb, rows, None)
    tree = _scores(model, tb, rows, packing.pack(rows, tb.input_ids, tb.lengths))
    sel = tb.response_mask > 0
    assert float((copies.logprobs - tree.logprobs)[sel].abs().max()) < 1e-5
    assert float((copies.entropy - tree.entropy)[sel].abs().max()) < 1e-5
    # and both are the behaviour log-probs the sampler recorded
    assert float((tree.logprobs - tb.rollout_logprobs)[sel].abs().max()) < 1e-5


def test_a_wrong_mask_is_caught(trials, model):
    """The comparison above fails when a branch may see its siblings (plain causal mask)."""
    tb = assemble(trials)
    rows = list(range(tb.num_sequences))
    good = packing.pack(rows, tb.input_ids, tb.lengths)
    causal = attrs.evolve(good, visible=torch.ones_like(good.visible).tril())
    copies = _scores(model, tb, rows, None)
    wrong = _scores(model, tb, rows, causal)
    sel = tb.response_mask > 0
    assert float((copies.logprobs - wrong.logprobs)[sel].abs().max()) > 1e-2


def _grads(model, trials, *, pack, **algorithm):
    opt = TorchOptimizer(
        TorchOptimizerConfig(lr=1e-3, clip_grad=0.0, pack=pack, micro_batch_tokens=48),
        algorithm=AlgorithmSection(**algorithm),
        temperature=1.0,
        model=model,
    )
    assert opt.pack is (pack == "tree")
    captured: list[torch.Tensor] = []
    real_step = opt.optim.step

    def step(*args, **kwargs):
        captured.extend(p.grad.detach().clone() for p in opt.params)
        return real_step(*args, **kwargs)

    opt.optim.step = step  # record the accumulated gradient of the one update
    metrics = opt.step(trials)
    return captured, metrics


def test_loss_and_gradients_from_the_tree_equal_the_copies(trials):
    """Per segment ("seq-mean") normalisation: the mode where rows matter most."""
    import copy

    base = tiny_causal_lm(vocab_size=128, init_std=0.3, seed=3)
    mode = "seq-mean-token-mean"
    g_copies, m_copies = _grads(copy.deepcopy(base), trials, pack="none", loss_agg_mode=mode)
    g_tree, m_tree = _grads(copy.deepcopy(base), trials, pack="tree", loss_agg_mode=mode)
    assert m_tree["pack/tree"] == 1.0 and m_copies["pack/tree"] == 0.0
    # each session had one compaction and one sub-agent, and the step metrics say so
    assert m_tree["compactions_per_trial/mean"] == m_tree["subagents_per_trial/mean"] == 1.0
    assert abs(m_tree["actor/pg_loss"] - m_copies["actor/pg_loss"]) < 1e-5
    for a, b in zip(g_copies, g_tree, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert any(float(g.abs().max()) > 1e-4 for g in g_tree)  # a real gradient, not zeros
    # fewer tokens computed for the same update
    assert m_tree["update/tokens"] < m_copies["update/tokens"] == m_copies["batch/tokens"]
    assert m_tree["batch/unique_tokens"] <= m_tree["update/tokens"]


def test_a_model_without_a_tree_mask_path_falls_back_to_copies():
    model = tiny_causal_lm()
    model.config.sliding_window = 4  # a window the tree mask does not express
    opt = TorchOptimizer(
        TorchOptimizerConfig(pack="tree"),
        algorithm=AlgorithmSection(),
        temperature=1.0,
        model=model,
    )
    assert opt.pack is False
    assert "sliding" in (opt.scorer.tree_packing_problem() or "")
