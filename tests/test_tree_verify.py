"""Step trees and verification functions: exact tables."""

import pytest
import torch

import decoding.verify as verify_mod
from decoding.tree import PLD, POOL, WINDOW, StepTree
from decoding.verify import verify_draft_model, verify_greedy, verify_sampling


def test_trie_merges_chains_and_masks_ancestors():
    t = StepTree.root(9)
    assert t.add_chain([1, 2, 3], PLD) == [1, 2, 3]
    assert t.add_chain([1, 2, 4], POOL) == [1, 2, 4]  # shares 1, 2
    assert t.add_chain([5], POOL) == [5]
    assert t.tokens == [9, 1, 2, 3, 4, 5]
    assert t.parents == [-1, 0, 1, 2, 2, 0]
    assert t.depths == [0, 1, 2, 3, 3, 1]
    assert t.sources[1] == PLD | POOL and t.sources[3] == PLD and t.sources[4] == POOL
    m = t.mask().int().tolist()
    assert m == [[1, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0],
                 [1, 1, 1, 0, 0, 0],
                 [1, 1, 1, 1, 0, 0],
                 [1, 1, 1, 0, 1, 0],
                 [1, 0, 0, 0, 0, 1]]
    assert not t.is_chain() and StepTree.root(1).is_chain()


def test_tree_mask_words_pack_the_tree_mask():
    """Random trees of 1 to 100 nodes (up to four words; rows past 31 set the sign bit)."""
    from kernels.mask import pack_mask, tree_mask_bytes, tree_mask_words
    g = torch.Generator().manual_seed(0)
    for T in (1, 2, 31, 32, 33, 64, 65, 100):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)]
        t = StepTree(tokens=list(range(T)), parents=parents)
        want = pack_mask(t.mask())
        for n_words in (want.shape[1], want.shape[1] + 1):  # padded to a wider batch's words
            got = torch.tensor(tree_mask_words(parents, n_words), dtype=torch.int32)
            assert torch.equal(got[:, :want.shape[1]], want) and not got[:, want.shape[1]:].any()
            raw = torch.frombuffer(bytearray(tree_mask_bytes(parents, n_words)), dtype=torch.int32)
            assert torch.equal(raw.view(T, n_words), got)  # the same words as bytes
    for pack in (tree_mask_words, tree_mask_bytes):
        with pytest.raises(ValueError, match="n_words"):
            pack([-1] + list(range(32)), 1)  # 33 rows do not fit one word
        with pytest.raises(ValueError, match=r"parents\[2\]"):
            pack([-1, 0, 2], 1)  # a row cannot be its own parent


def test_trie_node_budget_and_private_nodes():
    t = StepTree.root(0)
    t.add_chain([1, 2, 3], PLD, max_nodes=2)
    assert t.tokens == [0, 1, 2]
    t.add_chain([1, 2, 7], PLD, max_nodes=2)  # shared nodes cost nothing, new ones are refused
    assert t.tokens == [0, 1, 2]
    w = t.add_private_chain(0, [1, 2], WINDOW)  # same tokens, but never merged nor accepted
    assert w == [3, 4] and t.children[0] == {1: 1} and not t.candidate[3]
    assert t.num_candidates == 2


def test_verify_greedy_longest_path_plus_bonus():
    t = StepTree.root(0)
    t.add_chain([1, 2, 3], PLD)  # nodes 1, 2, 3
    t.add_chain([1, 5], POOL)  # node 4
    # argmax after each node: root -> 1, node1 -> 5, node4 -> 8
    nxt = {0: 1, 1: 5, 2: 3, 3: 0, 4: 8}
    assert verify_greedy(t, nxt) == ([0, 1, 4], 8)
    assert verify_greedy(t, {0: 7, 1: 0, 2: 0, 3: 0, 4: 0}) == ([0], 7)
    assert verify_greedy(t, {0: 1, 1: 2, 2: 3, 3: 6, 4: 0}) == ([0, 1, 2, 3], 6)


class Scripted:
    """Replaces the verifier's randomness: fixed uniforms, and records the distribution the
    final token is drawn from (returning its argmax)."""

    def __init__(self, uniforms):
        self.uniforms = list(uniforms)
        self.drawn_from = None

    def uniform(self, generator):
        return self.uniforms.pop(0)

    def sample(self, probs, generator):
        self.drawn_from = probs.clone()
        return int(probs.argmax())


@pytest.fixture
def scripted(monkeypatch):
    def make(uniforms):
        s = Scripted(uniforms)
        monkeypatch.setattr(verify_mod, "_uniform", s.uniform)
        monkeypatch.setattr(verify_mod, "sample", s.sample)
        return s
    return make


def tree_two_children():
    t = StepTree.root(0)
    t.add_chain([0, 3], PLD)  # node 1 (token 0), node 2 (token 3)
    t.add_chain([1], POOL)  # node 3 (token 1)
    return t


P_ROOT = torch.tensor([0.5, 0.3, 0.2, 0.0])
P_1 = torch.tensor([0.1, 0.1, 0.1, 0.7])


def test_recursive_rejection_accepts_with_p(scripted):
    t = tree_two_children()
    probs = {0: P_ROOT, 1: P_1, 2: torch.tensor([0.0, 0.0, 1.0, 0.0]), 3: P_1}
    s = scripted([0.49, 0.69])  # child 0: accept iff u < 0.5; then node 1's child 3: u < 0.7
    assert verify_sampling(t, probs, None) == ([0, 1, 2], 2)
    assert torch.equal(s.drawn_from, torch.tensor([0.0, 0.0, 1.0, 0.0]))


def test_recursive_rejection_residuals(scripted):
    t = tree_two_children()
    probs = {0: P_ROOT, 1: P_1, 2: P_1, 3: P_1}
    # child token 0 rejected (u=0.5 is not < 0.5); then token 1 is tried against the residual
    # [0, .3, .2, 0] / .5: accepted iff u < 0.6
    s = scripted([0.5, 0.59, 0.9])
    path, _ = verify_sampling(t, probs, None)
    assert path == [0, 3] and torch.allclose(s.drawn_from, P_1)
    s = scripted([0.5, 0.61])  # both rejected: bonus from [0, 0, .2, 0] / .2
    path, bonus = verify_sampling(t, probs, None)
    assert path == [0] and bonus == 2
    assert torch.allclose(s.drawn_from, torch.tensor([0.0, 0.0, 1.0, 0.0]))


def test_recursive_rejection_emits_p_exactly():
    """The exact law of what verify_sampling emits, through its own code over every branch of its
    randomness (tests/sampling_stats.py): the first token follows P_ROOT (P(0) = .5 by accepting
    child 0; P(1) = .5 * .3/.5 by accepting child 1 after it; P(2) = .2 as the bonus), and after
    an accepted child the next token follows that child's distribution."""
    from sampling_stats import enumerate_law

    t = tree_two_children()
    probs = {0: P_ROOT, 1: P_1, 2: torch.tensor([0.0, 0.0, 0.0, 1.0]), 3: torch.tensor([0.0, 0.5, 0.5, 0.0])}

    def emitted():
        path, bonus = verify_sampling(t, probs, None)
        return tuple(t.tokens[n] for n in path[1:]) + (bonus,)

    law = enumerate_law(emitted)
    first = torch.zeros(4, dtype=torch.float64)
    for out, p in law.items():
        first[out[0]] += p
    torch.testing.assert_close(first, P_ROOT.double())
    after_0 = {out[1]: p / 0.5 for out, p in law.items() if out[0] == 0}  # node 1 accepted: P_1 next
    assert after_0 == pytest.approx({0: 0.1, 1: 0.1, 2: 0.1, 3: 0.7})
    after_1 = {out[1]: p / 0.3 for out, p in law.items() if out[0] == 1}  # node 3 accepted: its own law
    assert after_1 == pytest.approx({1: 0.5, 2: 0.5})
    assert sum(law.values()) == pytest.approx(1.0)


def test_draft_model_rule(scripted):
    p = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]])
    q = torch.tensor([[0.4, 0.4, 0.2], [0.2, 0.2, 0.6]])
    # token 0 at step 0: accept iff u < min(1, .2/.4) = .5
    s = scripted([0.49, 0.99])  # accept; then token 0 at step 1: min(1, .6/.2) = 1 -> accept
    assert verify_draft_model([0, 0], p, q, None) == (2, 2)
    assert torch.allclose(s.drawn_from, p[2])
    s = scripted([0.5])  # reject: residual max(p - q, 0) = [0, .1, .1] / .2
    assert verify_draft_model([0, 0], p, q, None)[0] == 0
    assert torch.allclose(s.drawn_from, torch.tensor([0.0, 0.5, 0.5]))


def test_verify_greedy_walk_equals_verify_greedy_on_random_trees():
    """decoding.verify.verify's greedy branch and greedy_path (which walk the accepted path reading
    its rows' argmaxes alone) against verify_greedy of every candidate's argmax: random trees, rows in
    any order, top-1 tokens that follow the tree often."""
    import random

    from decoding.sampling import SamplingParams
    from decoding.verify import greedy_path, verify

    rng = random.Random(3)
    greedy = SamplingParams()
    for _ in range(300):
        t = StepTree.root(rng.randrange(5))
        for _ in range(rng.randrange(0, 6)):
            t.add_chain([rng.randrange(4) for _ in range(rng.randrange(1, 5))], PLD)
        if rng.random() < 0.3:
            private = t.add_private_chain(0, [rng.randrange(4)], WINDOW, group=0)
            if rng.random() < 0.5:
                t.extra_logits.update(private)
        nodes = t.logit_nodes()
        assert nodes == [i for i in range(len(t)) if t.candidate[i] or i in t.extra_logits]
        order = list(range(len(nodes)))
        rng.shuffle(order)
        rows = dict(zip(nodes, order))
        top1 = [rng.randrange(4) for _ in nodes]
        expect = verify_greedy(t, {n: top1[rows[n]] for n in nodes if t.candidate[n]})
        assert verify(t, None, rows, greedy, None, top1) == expect
        assert greedy_path(t, rows, top1) == expect  # what the loop calls for the common verify
