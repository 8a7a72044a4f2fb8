"""The step planner: exact tables on synthetic cost curves, learning from outcomes, and
losslessness with it on."""

from dataclasses import replace

import pytest
import torch

from decoding import Outcome, Planner, PlannerConfig, generate, make_proposer
from decoding.planner import (BACKED, CAL_DECAY, CAL_WEIGHT, MAX_DEPTH_KEY, NO_OPINION, NOT_BACKED, Acceptance,
                              node_estimates, node_keys, node_probs)
from decoding.draft import DraftModel, DraftModelConfig, DraftPLD
from decoding.tree import DRAFT, HARVEST, PLD, POOL, RECYCLE, SUFFIX, WINDOW, StepTree
from helpers import ours_from_hf, tiny_hf_model

FIXED = PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0)


def linear_cost(base: float, per_token: float):
    """ms of a forward: base + per_token x all step tokens of the batch."""
    return lambda tokens, contexts=None: base + per_token * sum(tokens)


def chain(n: int, source: int = PLD) -> StepTree:
    t = StepTree.root(0)
    t.add_chain(list(range(1, n + 1)), source)
    return t


def test_rates_follow_every_record_of_any_sequence():
    """Rates are memoised between records; a record of this sequence or of another one (the
    shared estimate it is smoothed towards) must show at once."""
    plan = Planner(linear_cost(10.0, 1.0), PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0, decay=1.0))
    a, b = plan.acceptance(0), plan.acceptance(1)
    key = (PLD, 1, 0, False, NO_OPINION)
    assert a.rate(key) == b.rate(key) == pytest.approx(0.4)
    a.record(key, True)  # a: (1 + shared * 2) / 3, shared: (1 + .4 * 2) / 3 = .6
    assert plan.shared.rate(key) == pytest.approx(0.6)
    assert a.rate(key) == pytest.approx((1 + 0.6 * 2) / 3)
    assert b.rate(key) == pytest.approx(0.6)  # b has no trials: the shared estimate, updated
    b.record(key, False)  # shared: (1 + .8) / 4 = .45
    assert a.rate(key) == pytest.approx((1 + 0.45 * 2) / 3)
    assert b.rate(key) == pytest.approx((0 + 0.45 * 2) / 3)


def test_node_probs_multiply_along_paths_and_rank():
    t = chain(3)
    t.add_chain([7], POOL)  # a second child of the root: rank 1
    t.add_private_chain(0, [9], WINDOW, group=0)
    acc = Acceptance(FIXED)
    key = (POOL, 1, 1, False, NO_OPINION)
    acc.hits[key], acc.trials[key] = 0.0, 2.0  # (0 + .4 * 2) / (2 + 2) = .2
    assert node_probs(t, acc) == pytest.approx([1, 0.4, 0.16, 0.064, 0.2, 0.0])


@pytest.mark.parametrize("cost, keep", [
    (linear_cost(10, 1), [0, 1, 2]),  # (1 + .4 + .16) / 13 beats 1/11, 1.4/12 and 1.624/14
    (linear_cost(10, 10), [0]),  # a token costs as much as the whole step: plain decoding
    (linear_cost(10, 0), [0, 1, 2, 3, 4, 5, 6]),  # flat: send everything
    (lambda tokens, contexts=None: 10 if sum(tokens) <= 4 else 100, [0, 1, 2, 3]),  # a cliff after 4 tokens
])
def test_select_on_a_chain(cost, keep):
    assert Planner(cost, FIXED).select([0], [chain(6)]) == [keep]


def test_select_stops_scanning_once_nothing_left_can_win():
    """On a long chain the best prefix is [0, 1, 2] (see above); the scan stops a few items
    later, when even every remaining node's gain could not beat it, instead of pricing all 40."""
    calls = []
    cost = linear_cost(10, 1)
    plan = Planner(lambda tokens, contexts=None: calls.append(1) or cost(tokens), FIXED)
    assert plan.select([0], [chain(40)]) == [[0, 1, 2]]
    assert len(calls) < 12


def test_outcome_argmax_per_node_from_one_pass():
    """Outcome.argmax picks each node's row of one argmax over all rows, kept between calls."""
    logits = torch.randn(3, 50)
    out = Outcome(tree=chain(3), path=[0], new_tokens=[], logits=logits, rows={0: 2, 1: 0, 2: 1}, sent=3)
    top1 = logits.argmax(-1).tolist()
    assert out.argmax([1]) == [top1[0]]
    assert out.argmax([2, 0, 1]) == [top1[1], top1[2], top1[0]]
    assert out.argmax([]) == []


@pytest.mark.parametrize("min_gain, keep, depth", [(0.0, [0, 1, 2], 2), (0.3, [0, 1, 2], 2), (0.35, [0], 0)])
def test_min_gain_is_the_promise_drafts_must_beat(min_gain, keep, depth):
    """The best prefix promises (1 + .4 + .16) / 13 tokens per ms, 1.32x a one-token step's
    1 / 11: sent at a required gain of 30%, not at 35% (then a one-token step)."""
    cfg = PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0, min_gain=min_gain)
    assert Planner(linear_cost(10, 1), cfg).select([0], [chain(6)]) == [keep]
    assert Planner(linear_cost(10, 1), cfg).max_depth([0], PLD) == [depth]
    with pytest.raises(ValueError, match="min_gain"):
        PlannerConfig(min_gain=-0.1)


def test_select_ranks_nodes_across_the_batch():
    # a: nothing accepted so far (rates near 0); b: everything accepted. Tokens cost 1 of 10.
    plan = Planner(linear_cost(10, 1), FIXED)
    for _ in range(20):
        plan.acceptance(0).record((PLD, 1, 0, False, NO_OPINION), False)
        for d in range(1, 5):
            plan.acceptance(1).record((PLD, d, 0, False, NO_OPINION), True)
    assert plan.select([0, 1], [chain(4), chain(4)]) == [[0], [0, 1, 2, 3, 4]]


def test_a_batch_step_never_passes_max_step_tokens():
    """Free tokens (flat cost, every draft accepted) fill each tree, but the batch's step stays
    within max_step_tokens (the CUDA graphs' rows): in select and in max_depth."""
    cfg = PlannerConfig(prior=0.9, learn_overhead=False, explore=0.0, max_step_tokens=12)
    plan = Planner(linear_cost(10, 0), cfg)
    kept = plan.select([0, 1, 2], [chain(6), chain(6), chain(6)])
    assert sum(len(k) for k in kept) == 12
    free = Planner(linear_cost(10, 0), replace(cfg, max_step_tokens=None))
    assert sum(len(k) for k in free.select([0, 1, 2], [chain(6), chain(6), chain(6)])) == 21
    assert plan.max_depth([0, 1, 2], PLD) == [9, 9, 9]  # each alone beside two one-token rows: 3 + 9 = 12
    assert free.max_depth([0, 1, 2], PLD)[0] > 9
    with pytest.raises(ValueError, match="max_step_tokens"):
        PlannerConfig(max_step_tokens=0)


def test_planner_for_caps_a_step_at_the_graphs_rows(tiny):
    from decoding.options import planner_for
    from models.graphs import StepGraphs

    cost = linear_cost(10, 1)
    assert planner_for(tiny, "pld", False, None, cost).cfg.max_step_tokens is None
    tiny.step_graphs = {"capture": False}
    try:
        assert planner_for(tiny, "pld", False, None, cost).cfg.max_step_tokens == StepGraphs.DEFAULT_MAX_TOKENS
        tiny.step_graphs = {"capture": False, "max_tokens": 32}
        assert planner_for(tiny, "pld", False, None, cost).cfg.max_step_tokens == 32
    finally:
        tiny.step_graphs = None


def test_window_columns_are_sent_whole_and_in_order():
    t = chain(1)
    for g in range(3):  # columns of 2 private nodes each
        t.add_private_chain(0, [10 + g, 20 + g], WINDOW, group=g)
    flat = Planner(linear_cost(10, 0), FIXED).select([0], [t])
    assert flat == [list(range(len(t)))]
    plan = Planner(linear_cost(10, 0.2), PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0, window_rate=0.3))
    # a column is worth .3 tokens for .4 ms: the pld node (.4 tokens for .2 ms) goes first, then the columns
    assert plan.select([0], [t]) == [list(range(len(t)))]
    dear = Planner(linear_cost(10, 0.2), PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0,
                                                       window_rate=0.01))
    assert dear.select([0], [t]) == [[0, 1]]


def test_max_depth_follows_the_cost_curve():
    assert Planner(linear_cost(10, 1), FIXED).max_depth([0], PLD) == [2]
    assert Planner(linear_cost(10, 10), FIXED).max_depth([0], PLD) == [0]
    assert Planner(linear_cost(10, 0), PlannerConfig(max_tokens=16, learn_overhead=False)).max_depth([0], PLD)[0] > 5


def test_first_tokens_are_keyed_by_whether_a_recycled_prediction_backs_them():
    """A first draft token whose siblings hold a recycled prediction is keyed BACKED (it is
    one) or NOT_BACKED (it is not); without one among its siblings, and at any deeper level,
    NO_OPINION. The estimates read the keys that observe records."""
    t = StepTree.root(0)
    copied = t.add_child(0, 1, PLD)  # rank 0, copied; the model predicted 2 and 3 instead
    backed = t.add_child(0, 2, SUFFIX)
    t.add_child(0, 2, RECYCLE)  # merged: suffix + recycle
    alone = t.add_child(0, 3, RECYCLE)
    deep = [t.add_child(n, 9, PLD) for n in (copied, backed)]
    deep_recycled = t.add_child(backed, 8, RECYCLE)
    assert node_keys(t, copied) == [(PLD, 1, 0, False, NOT_BACKED)]
    assert node_keys(t, backed, True) == [(RECYCLE, 1, 1, True, BACKED), (SUFFIX, 1, 1, True, BACKED)]
    assert node_keys(t, alone) == [(RECYCLE, 1, 2, False, BACKED)]
    for n in deep + [deep_recycled]:
        assert node_keys(t, n)[0][-1] == NO_OPINION
    plain = chain(2)  # no recycled prediction anywhere: the keys of every proposer without one
    assert node_keys(plain, 1) == [(PLD, 1, 0, False, NO_OPINION)]
    # evidence recorded under node_keys' keys moves exactly that node's estimate
    acc = Acceptance(PlannerConfig(prior=0.4, explore=0.0, decay=1.0))
    before = node_probs(t, acc)
    for _ in range(8):
        for key in node_keys(t, copied):
            acc.record(key, False)
    after = node_probs(t, acc)
    assert after[copied] == pytest.approx(0.4 * 2 / 10) and before[copied] == pytest.approx(0.4)
    assert after[deep[0]] == pytest.approx(after[copied] * 0.4)
    assert [after[n] for n in (backed, deep[1])] == [before[n] for n in (backed, deep[1])]
    assert node_probs(plain, acc) == pytest.approx([1, 0.4, 0.16])  # NO_OPINION keys untouched


def brute_max_depth(plan: Planner, sid: int, n_seqs: int, b: int, bits: list[int]) -> int:
    """max_depth's definition, every depth priced (no early stop)."""
    acc, tokens = plan.acceptance(sid), [1] * n_seqs
    best, best_d, p, gain = n_seqs / plan._time(tokens) * (1 + plan.cfg.min_gain), 0, 1.0, float(n_seqs)
    for d in range(1, plan.cfg.max_tokens):
        p *= max(acc.optimistic((bit, min(d, MAX_DEPTH_KEY), 0, acc.streak, NO_OPINION)) for bit in bits)
        gain += p
        tokens[b] += 1
        if gain / plan._time(tokens) > best:
            best, best_d = gain / plan._time(tokens), d
        if p < 1e-3:
            break
    return best_d


def test_max_depth_stops_early_only_where_nothing_deeper_can_win():
    """Deep chains (rates near 0.99) on cost curves that are flat, linear, stepped or grow with
    the batch: the early stop gives the depth of pricing every depth, with fewer cost calls."""
    g = torch.Generator().manual_seed(0)
    costs = [linear_cost(10, 0.05), linear_cost(10, 0.5), linear_cost(10, 0.0),
             lambda tokens, contexts=None: 10 + 3 * (sum(tokens) // 16) + 0.01 * sum(tokens),
             lambda tokens, contexts=None: 10 + 0.2 * max(0, sum(tokens) - 8)]
    calls = [0, 0]
    for trial in range(60):
        cost = costs[trial % len(costs)]
        cfg = PlannerConfig(prior=0.4, explore=float(torch.rand(1, generator=g)), learn_overhead=False,
                            max_tokens=int(torch.randint(4, 128, (1,), generator=g)))
        plan = Planner(cost, cfg)
        n_seqs = int(torch.randint(1, 4, (1,), generator=g))
        for sid in range(n_seqs):
            acc = plan.acceptance(sid)
            for d in range(1, MAX_DEPTH_KEY + 1):
                for src in (PLD, POOL):
                    hit = float(torch.rand(1, generator=g)) ** 0.2  # mostly high
                    key = (src, d, 0, False, NO_OPINION)
                    acc.hits[key], acc.trials[key] = 40 * hit, 40.0
        counting = Planner(lambda t, contexts=None: calls.__setitem__(0, calls[0] + 1) or cost(t), cfg)
        counting.seq_acc, counting.shared = plan.seq_acc, plan.shared
        got = counting.max_depth(list(range(n_seqs)), PLD | POOL)
        brute = Planner(lambda t, contexts=None: calls.__setitem__(1, calls[1] + 1) or cost(t), cfg)
        brute.seq_acc, brute.shared = plan.seq_acc, plan.shared
        assert got == [brute_max_depth(brute, sid, n_seqs, sid, [PLD, POOL]) for sid in range(n_seqs)]
    assert calls[0] < calls[1] / 2  # the stop does stop


def test_node_estimates_are_both_node_probs():
    t = chain(4)
    t.add_chain([7, 8], POOL)
    t.add_chain([1, 9], POOL)  # merges with the chain's first node
    t.add_private_chain(0, [9], WINDOW, group=0)
    acc = Acceptance(PlannerConfig(prior=0.4, explore=1.0))
    acc.hits[(POOL, 2, 1, False, NO_OPINION)], acc.trials[(POOL, 2, 1, False, NO_OPINION)] = 3.0, 4.0
    rate, opt = node_estimates(t, acc)
    assert rate == node_probs(t, acc) and opt == node_probs(t, acc, optimistic=True)
    assert opt[1] > rate[1] and opt != rate  # (a later sibling can lose: the earlier one takes more)


def test_long_contexts_make_tokens_dearer():
    """A cost that knows each sequence's committed length: a token of a step over a long
    prefix costs more (attention), so the same chain is cut shorter there."""
    def cost(tokens, contexts):
        return 10 + sum(t * (0.1 + c / 1000) for t, c in zip(tokens, contexts))

    plan = Planner(cost, FIXED)
    # 0.2 ms a token: (1 + .4 + .16 + .064) / 10.8 beats 1.56 / 10.6 and 1.65 / 11.0
    assert plan.max_depth([0], PLD, [100]) == [3] and plan.select([0], [chain(6)]) == [[0, 1, 2, 3]]
    # 2 ms a token: 1.4 / 14 beats 1 / 12 and 1.56 / 16
    assert plan.max_depth([0], PLD, [1900]) == [1] and plan.select([0], [chain(6)]) == [[0, 1]]
    # one batch: the short sequence keeps its 3 nodes, the long one (4.1 ms a token) none; ranked
    # by tokens per added ms, the long sequence's nodes come last and are cut
    assert plan.max_depth([0, 1], PLD, [100, 4000]) == [3, 0]
    assert plan.select([0, 1], [chain(6), chain(6)]) == [[0, 1, 2, 3], [0]]
    assert Planner(linear_cost(10, 1), FIXED).max_depth([0], PLD, [5000]) == [2]  # a cost without lengths


def test_optimism_tries_what_the_prior_rules_out():
    # a 2-token step costs 1.5x: a node at the prior .4 does not pay, its optimistic bound does
    cost = linear_cost(10, 10)
    assert Planner(cost, FIXED).select([0], [chain(3)]) == [[0]]
    optimist = Planner(cost, PlannerConfig(prior=0.4, learn_overhead=False, explore=1.0))
    assert optimist.select([0], [chain(3)]) == [[0, 1]]
    for _ in range(30):  # evidence that it is rarely accepted ends the optimism
        optimist.acceptance(0).record((PLD, 1, 0, False, NO_OPINION), False)
    assert optimist.select([0], [chain(3)]) == [[0]]


def outcome(tree, path, rows):
    return Outcome(tree=tree, path=path, new_tokens=[1] * len(path), logits=torch.zeros(len(rows), 4),
                   rows={n: j for j, n in enumerate(rows)}, sent=len(rows))


def test_observe_counts_trials_whose_parent_was_accepted():
    plan = Planner(linear_cost(10, 1), FIXED)
    t = chain(3)
    plan.observe(0, outcome(t, [0, 1], [0, 1, 2, 3]))  # node 1 accepted, node 2 rejected, node 3 untested
    acc = plan.acceptance(0)
    assert acc.trials == {(PLD, 1, 0, False, NO_OPINION): 1.0, (PLD, 2, 0, False, NO_OPINION): 1.0}
    assert acc.hits == {(PLD, 1, 0, False, NO_OPINION): 1.0, (PLD, 2, 0, False, NO_OPINION): 0.0}
    assert plan.shared.trials == acc.trials  # the batch's estimate learns too
    assert acc.rate((PLD, 1, 0, False, NO_OPINION)) > 0.4 > acc.rate((PLD, 2, 0, False, NO_OPINION))
    assert acc.streak  # a draft was accepted: the next step's trials count as "in a streak"
    plan.observe(0, outcome(t, [0], [0, 1]))  # only what was sent counts
    assert acc.trials[(PLD, 1, 0, True, NO_OPINION)] == 1.0 and acc.trials[(PLD, 2, 0, False, NO_OPINION)] == 1.0
    assert not acc.streak


def test_window_credit_and_cost():
    plan = Planner(linear_cost(10, 1), FIXED)
    t = StepTree.root(0)
    t.add_chain([1], HARVEST)
    t.add_chain([2], PLD | HARVEST)
    t.add_private_chain(0, [5], WINDOW, group=0)
    t.add_private_chain(0, [6], WINDOW, group=1)
    before = plan.window_rate
    plan.observe(0, outcome(t, [0, 1], [0, 1, 2, 3]))  # only column 0 was sent
    assert plan.window_credit == 1 and plan.window_columns == 1 and plan.window_rate > before


def test_overhead_is_learned_from_wall_time():
    plan = Planner(linear_cost(10, 1), PlannerConfig())
    for _ in range(100):
        plan.observe_time([1], 31.0, 1)  # 11 ms predicted, 31 measured
    assert plan.overhead_ms == pytest.approx(20, abs=0.1)
    assert plan.log["steps"] == 100 and plan.log["predicted_ms"] == pytest.approx(1100)
    assert plan.overhead_per_token == 0.0  # one step size: no slope to see
    grows = Planner(linear_cost(10, 1), PlannerConfig())
    for i in range(200):  # host time 5 + 0.5 ms per step token
        n = 1 + i % 9
        grows.observe_time([n], 10 + n + 5 + 0.5 * n, 1)
    assert grows.overhead_per_token == pytest.approx(0.5, abs=1e-6)
    assert grows._time([3]) == pytest.approx(13 + 5 + 1.5, abs=1e-6)
    assert grows._time([9]) == pytest.approx(19 + 5 + 4.5, abs=1e-6)
    fixed = Planner(linear_cost(10, 1), PlannerConfig(learn_overhead=False))  # --fixed-plan
    for i in range(200):
        n = 1 + i % 9
        fixed.observe_time([n], 10 + n + 5 + 0.5 * n, 1)
    assert fixed._time([3]) == 13 and fixed._time([9]) == 19  # the curve alone: wall time changes nothing
    assert fixed.log["steps"] == 200  # still reported


def test_a_curve_that_overprices_steps_is_learnt_down_to_its_floor():
    """A curve measured while the machine ran slower than now: the steps take less than it says,
    the time learnt beyond it goes below zero and the predictions follow the wall clock (so a
    one-token step is not priced above what it costs, which made drafts look cheaper than they
    are); never below MIN_OF_CURVE of the curve."""
    from decoding.planner import MIN_OF_CURVE

    faster = Planner(linear_cost(10, 1), PlannerConfig())
    for i in range(200):  # each step 3 ms under the curve, wider steps 0.2 ms a token more so
        n = 1 + i % 9
        faster.observe_time([n], 10 + n - 3 + 0.2 * (n - 1), 1)
    assert faster.overhead_ms < 0 and faster.overhead_per_token == pytest.approx(0.2, abs=1e-6)
    assert faster._time([1]) == pytest.approx(8, abs=1e-6) and faster._time([9]) == pytest.approx(17.6, abs=1e-6)
    floor = Planner(linear_cost(10, 1), PlannerConfig())
    for _ in range(100):
        floor.observe_time([1], 2.0, 1)  # a fifth of the curve
    assert floor.overhead_ms == pytest.approx(-9, abs=0.01)
    assert floor._time([1]) == MIN_OF_CURVE * 11 and floor._time([5]) == MIN_OF_CURVE * 15


def test_a_proposers_own_chances_replace_the_keyed_rates():
    t = chain(2, DRAFT)
    t.add_chain([5], PLD)  # rank 1 under the root
    t.add_chain([1, 2, 3], PLD)  # merged with the draft chain, one PLD node deeper
    t.chance = {1: 0.9, 2: 0.5}  # the draft model's estimates for its chain
    acc = Acceptance(FIXED)
    # node 1 (draft | pld): max(.9, .4); node 2 too: max(.5, .4); node 3 ([5], PLD): .4 capped by what
    # its elder sibling left (.1); node 4 (the PLD chain's third token): .4
    assert node_probs(t, acc) == pytest.approx([1, 0.9, 0.45, 0.1, 0.18])
    only_draft = chain(2, DRAFT)
    only_draft.chance = {1: 0.2, 2: 0.95}
    assert node_probs(only_draft, acc) == pytest.approx([1, 0.2, 0.19])  # not max'ed with the prior
    sub, _ = only_draft.subtree([0, 1])
    assert sub.chance == {1: 0.2}


def test_pinned_nodes_are_sent_whatever_they_cost():
    # a sampled draft chain: dropping a drawn token for what was drawn would bias min(1, p/q)
    t = chain(3, DRAFT)
    t.add_chain([9], PLD)
    t.pinned = {2}  # node 2 and its parent 1 go; node 3 and the PLD node are the planner's to pick
    assert Planner(linear_cost(10, 20), FIXED).select([0], [t]) == [[0, 1, 2]]  # 1.56 / 70 beats 1.96 / 90
    assert Planner(linear_cost(10, 0), FIXED).select([0], [t]) == [[0, 1, 2, 3, 4]]
    assert t.subtree([0, 1, 2])[0].pinned == {2}


def test_step_times_and_a_proposers_model_time():
    plan = Planner(linear_cost(10, 1), FIXED)
    times = plan.step_times([0, 1, 2])
    assert [times[1](n) for n in (1, 4)] == [13.0, 16.0]
    grows = Planner(linear_cost(10, 1), PlannerConfig())
    for _ in range(50):  # 11 ms predicted + 5 ms host + 30 ms of the proposer's draft model
        grows.observe_time([1], 46.0, 1, model_ms=30.0)
    assert grows.overhead_ms == pytest.approx(5, abs=0.01)  # the draft model's time is not host overhead
    assert grows.log["predicted_ms"] == pytest.approx(50 * 41) and grows.log["measured_ms"] == pytest.approx(50 * 46)


@pytest.mark.parametrize("bad, match", [(dict(prior=1.0), "prior"), (dict(decay=0), "decay"),
                                        (dict(max_tokens=0), "max_tokens"), (dict(window_weight=0), "window")])
def test_bad_planner_config(bad, match):
    with pytest.raises(ValueError, match=match):
        PlannerConfig(**bad)


# ---- with the model --------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 9], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 11, 12], [40],
           [7, 7, 7, 7, 8, 8]]


@pytest.fixture(scope="module")
def tiny():
    return ours_from_hf(tiny_hf_model("llama", seed=3)).model


@pytest.mark.parametrize("name", ["pld", "jacobi", "lookahead", "lookahead+pld"])
@pytest.mark.parametrize("per_token", [0.0, 0.3, 100.0])
def test_planned_steps_are_lossless_and_sized_by_cost(tiny, name, per_token):
    ref = [generate(tiny, [p], max_new_tokens=20, eos_token_ids=())[0].output_ids for p in PROMPTS]
    plan = Planner(linear_cost(10, per_token), PlannerConfig(learn_overhead=False))
    res = generate(tiny, PROMPTS, make_proposer(name), planner=plan, max_new_tokens=20, eos_token_ids=())
    assert [r.output_ids for r in res] == ref
    tokens_per_seq_step = plan.log["step_tokens"] / plan.log["seq_steps"]
    if per_token == 100.0:  # a token costs ten steps: never worth it
        assert tokens_per_seq_step == 1.0
    if per_token == 0.0:  # free tokens: whatever the proposer has (PLD: only where the text matches)
        assert tokens_per_seq_step > (4 if name.startswith("lookahead") else 1.5)


def test_sibling_chances_sum_to_at_most_one():
    t = StepTree.root(0)
    for tok in (1, 2, 3):
        t.add_chain([tok], PLD)  # three children of the root: ranks 0, 1, 2
    acc = Acceptance(FIXED)
    for rank in range(3):
        key = (PLD, 1, rank, False, NO_OPINION)
        acc.hits[key], acc.trials[key] = 8.0, 8.0  # (8 + .8) / 10 = .88 each
    assert node_probs(t, acc) == pytest.approx([1, 0.88, 0.12, 0.0])


@pytest.mark.parametrize("cls", [DraftModel, DraftPLD])
def test_planned_draft_chains_are_lossless_and_sized_by_cost(tiny, cls):
    """The draft model sizes its own chain: the target drafting for itself (every greedy
    draft accepted) under a step that costs a second drafts to the cap; a draft forward
    priced at a day never drafts."""
    ref = [generate(tiny, [p], max_new_tokens=30, eos_token_ids=())[0].output_ids for p in PROMPTS]
    cfg = DraftModelConfig(num_draft=2, max_draft=6)
    runs = {}
    for name, token_ms in (("cheap", None), ("dear", 86_400_000.0)):
        prop = cls(tiny, cfg)
        prop.token_ms = token_ms
        plan = Planner(linear_cost(1000, 0.0), PlannerConfig(learn_overhead=False))
        res = generate(tiny, PROMPTS, prop, planner=plan, max_new_tokens=30, eos_token_ids=())
        assert [r.output_ids for r in res] == ref
        runs[name] = plan.log["step_tokens"] / plan.log["seq_steps"]
    assert runs["cheap"] > 4.5  # beyond num_draft (2): the planned chain grows to max_draft (6)
    if cls is DraftModel:
        assert runs["dear"] == 1.0


def test_draft_pld_skips_the_draft_model_where_prompt_lookup_is_likely(tiny):
    """draft+pld counts what its prompt-lookup candidates are expected to give before it runs
    the draft model: after a run of accepted copies, a draft forward does not pay."""
    from decoding.proposer import SeqState

    prop = DraftPLD(tiny, DraftModelConfig())
    state = prop.init_state(SeqState(0, [1, 2, 3, 1, 2], 3))
    prop._found = {0: [[3, 1, 2]]}
    gain, p1, n = prop._other(state)
    assert n == 3 and p1 == pytest.approx(0.4) and gain == pytest.approx(0.4 + 0.16 + 0.064)
    for d in (1, 2, 3):
        for _ in range(40):
            state.pld_acc.record((PLD, d, 0, False, NO_OPINION), True)
    gain, p1, n = prop._other(state)
    assert p1 > 0.95 and gain > 2.8
    prop.token_ms = 30.0  # a draft forward: 30 ms beside a 100 ms step
    step_ms = lambda tokens: 100.0 + tokens  # noqa: E731
    fresh = prop.calibration.first() * (1 - 0.4)
    assert prop._worth(step_ms, 0, 1.62, 1.0, fresh, 1, 3)  # candidates at the prior: draft too
    assert not prop._worth(step_ms, 0, 1.0 + gain, 1.0, prop.calibration.first() * (1 - p1), 1, n)
    assert DraftModel(tiny)._other(state) == (0.0, 0.0, 0)


def test_calibration_scales_chances_by_accepted_over_expected():
    """A step that sent drafts expected sum(chances) of them; what was accepted, over that
    (decayed, smoothed towards 1 by CAL_WEIGHT tokens, at most 1), scales every node's chance
    in later plans, which then send less where the estimates overshot."""
    cost = linear_cost(10, 5)  # 1/15 < 1.4/20 > 1.56/25: a chain at the prior sends its first node
    plan, plain = Planner(cost, FIXED), Planner(cost, replace(FIXED, calibrate=False))
    assert plan.calibration == plain.calibration == 1.0
    for src in (PLD, POOL):  # sources never tried, so both estimate them at the prior
        for p in (plan, plain):
            t = chain(3, src)
            assert p.select([0], [t]) == [[0, 1]]  # expected 0.4 draft tokens
            p.observe(0, outcome(t, [0], [0, 1]))  # none accepted
        if src == PLD:
            assert plan.calibration == pytest.approx(CAL_WEIGHT / (0.4 + CAL_WEIGHT))
    assert plain.calibration == 1.0
    assert plan.calibration == pytest.approx(CAL_WEIGHT / (0.4 * CAL_DECAY + 0.4 + CAL_WEIGHT))
    assert plain.select([0], [chain(3, SUFFIX)]) == [[0, 1]]
    assert plan.select([0], [chain(3, SUFFIX)]) == [[0]]  # (1 + 0.4 x 0.79) / 20 < 1 / 15


def test_calibration_never_raises_chances():
    plan = Planner(linear_cost(10, 1), FIXED)
    t = chain(3)
    for _ in range(5):
        plan.select([0], [t])
        plan.observe(0, outcome(t, [0, 1, 2, 3], [0, 1, 2, 3]))  # more accepted than expected
    assert plan.calibration == 1.0
