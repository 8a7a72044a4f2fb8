"""Exact tables for the decoding algorithms, as pure functions over token lists."""

import itertools

import pytest

from decoding.draft import Calibration, draft_cache_keep, worth_drafting
from decoding.recycle import grow_tree as grow_recycled
from decoding.recycle import refresh, seed_table
from decoding.suffix import SuffixConfig, SuffixTrie
from decoding.suffix import grow_tree as grow_suffix
from decoding.jacobi import initial_guess, next_guess
from decoding.lookahead import harvest, slide
from decoding.ngram_pool import NgramPool
from decoding.tree import HARVEST, PLD, POOL, RECYCLE, WINDOW, StepTree

T, F = True, False


# ---- lookahead window: n-gram harvest ---------------------------------------------------------
LEVELS = [[0, 11, 12], [20, 21, 22], [30, 31, 32]]  # N = 4, W = 3; levels[0][0] stands for the root


@pytest.mark.parametrize("real, want", [
    ([[T, T, T], [T, T, T], [T, T, T]], [(9, 20, 30, 40), (11, 21, 31, 41), (12, 22, 32, 42)]),
    ([[F, T, T], [T, T, T], [T, T, T]], [(9, 20, 30, 40), (11, 21, 31, 41), (12, 22, 32, 42)]),  # root is real
    ([[T, T, T], [T, F, T], [T, T, T]], [(9, 20, 30, 40), (12, 22, 32, 42)]),
    ([[T, T, F], [T, T, T], [F, T, T]], [(11, 21, 31, 41)]),
    ([[F, F, F], [F, F, F], [F, F, F]], []),
])
def test_harvest(real, want):
    assert harvest(9, LEVELS, real, [40, 41, 42]) == want


def test_harvest_skips_columns_not_sent():
    real = [[T, T, T], [T, T, T], [T, T, T]]
    assert harvest(9, LEVELS, real, [40, None, 42]) == [(9, 20, 30, 40), (12, 22, 32, 42)]


def test_harvest_n2_window_is_one_level():
    # N = 2: one level, the n-gram is (level-0 token, new token)
    assert harvest(5, [[0, 6, 7]], [[F, T, F]], [1, 2, 3]) == [(5, 1), (6, 2)]


# ---- lookahead window: slide -------------------------------------------------------------------
@pytest.mark.parametrize("skip, levels, real", [
    (0, [[4, 5, 6], [7, 8, 9]], [[T, T, F], [T, T, T]]),
    (1, [[5, 6, 100], [8, 9, 101]], [[T, F, F], [T, T, F]]),
    (2, [[6, 100, 101], [9, 102, 103]], [[F, F, F], [T, F, F]]),
    (5, [[100, 101, 102], [103, 104, 105]], [[F, F, F], [F, F, F]]),  # past the window: all refilled
])
def test_slide(skip, levels, real):
    draws = itertools.count(100)
    got = slide([[1, 2, 3], [4, 5, 6]], [[F, F, F], [T, T, F]], [7, 8, 9], skip, lambda: next(draws))
    assert got == (levels, real)


def test_slide_keeps_unsent_columns_unreal():
    got = slide([[1, 2, 3], [4, 5, 6]], [[T, T, T], [T, T, T]], [7, None, None], 0, lambda: 0)
    assert got == ([[4, 5, 6], [7, 5, 6]], [[T, T, T], [T, F, F]])


# ---- lookahead pool ------------------------------------------------------------------------------
def test_ngram_pool_lru():
    pool = NgramPool(3, capacity=2)
    pool.add_all([1, 2, 3, 1, 4, 5, 1, 2, 3])
    assert pool.get(1) == [(2, 3), (4, 5)]  # (2, 3) refreshed last
    pool.add([1, 9, 9])
    assert pool.get(1) == [(9, 9), (2, 3)]  # (4, 5) was least recent: evicted
    pool.add([1, 2, 3])
    assert pool.get(1) == [(2, 3), (9, 9)]  # refreshing reorders, evicts nothing
    assert pool.get(7) == [] and len(pool) == 6  # 2 under key 1, one under each of 2, 3, 4, 5
    pool.add([1, 2])  # wrong length: ignored
    assert len(pool) == 6 and NgramPool(3, 0).get(1) == []


def test_ngram_pool_origins():
    pool = NgramPool(2, capacity=3)
    pool.add([1, 2], HARVEST)
    pool.add([1, 3])
    pool.add([1, 2])  # the text gives it too: text origin
    pool.add([1, 4], HARVEST)
    pool.add([1, 3], HARVEST)  # stays a text n-gram, refreshed
    assert pool.items(1) == [((3,), POOL), ((4,), HARVEST), ((2,), POOL)]


@pytest.mark.parametrize("start, want", [
    (0, {1: [(2, 3)], 2: [(3, 4)], 3: [(4, 5)]}),
    (3, {2: [(3, 4)], 3: [(4, 5)]}),  # n-grams ending at index >= 3
    (5, {}),
])
def test_ngram_pool_add_all_from(start, want):
    pool = NgramPool(3, capacity=4)
    pool.add_all([1, 2, 3, 4, 5], start)
    assert {k: pool.get(k) for k in pool.table} == want


# ---- Jacobi ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preds, accepted, window, want", [
    ([10, 11, 12, 13], 0, 4, [11, 12, 13, 13]),  # nothing accepted: the old chain's predictions shift
    ([10, 11, 12, 13], 1, 4, [12, 13, 13, 13]),
    ([10, 11, 12, 13], 3, 4, [99, 99, 99, 99]),  # all accepted: nothing fresh, the root repeats
    ([10, 11, 12, 13, 14, 15], 1, 2, [12, 13]),
])
def test_jacobi_next_guess(preds, accepted, window, want):
    assert next_guess(preds, accepted, 99, window) == want


def test_jacobi_initial_guess():
    assert initial_guess([1, 2, 3, 4], 3) == [2, 3, 4]
    assert initial_guess([1, 2], 5) == [1, 2, 1, 2, 1]


# ---- draft-model cache truncation ---------------------------------------------------------------------
@pytest.mark.parametrize("cached, history_len, new_tokens, accepted, keep", [
    (12, 11, 1, 0, 10),  # history 10 + chain of 3 (2 cached); nothing accepted: back to the history
    (12, 12, 2, 1, 11),  # one draft accepted
    (12, 14, 4, 3, 12),  # all 3 accepted: everything cached agrees, the bonus is not cached yet
    (12, 12, 2, 3, 11),  # 3 accepted but the sequence ended after 2 new tokens (EOS / length)
    (9, 11, 1, 0, 9),  # nothing was drafted (depth 0): the root was not fed, the cache is untouched
])
def test_draft_cache_keep(cached, history_len, new_tokens, accepted, keep):
    assert draft_cache_keep(cached, history_len, new_tokens, accepted) == keep


# ---- draft-model chain length --------------------------------------------------------------------------
def test_draft_calibration_table():
    cal = Calibration(bins=4, weight=2.0, decay=1.0, first_prior=0.5)
    assert [cal.bin(c) for c in (0.0, 0.24, 0.25, 0.99, 1.0)] == [0, 0, 1, 3, 3]
    assert cal.rate(0.9) == pytest.approx(0.875)  # no evidence: the bin's centre
    for hit in (True, True, False, True):
        cal.record(0.9, hit, first=True)
    assert cal.rate(0.9) == pytest.approx((3 + 0.875 * 2) / (4 + 2))
    assert cal.rate(0.1) == pytest.approx(0.125)  # other bins untouched
    p = (3 + 0.5 * 2) / 6
    assert cal.first() == pytest.approx(p + (p * (1 - p) / 6) ** 0.5)
    cal.record(0.1, False)  # not a chain's first token: the first-token estimate is unchanged
    assert cal.first() == pytest.approx(p + (p * (1 - p) / 6) ** 0.5)


@pytest.mark.parametrize("gain, ms, reach, chance, more_ms, want", [
    (1.0, 100.0, 1.0, 0.5, 40.0, True),  # 1.5 / 140 beats 1 / 100
    (1.0, 100.0, 1.0, 0.3, 40.0, False),  # 1.3 / 140 does not
    (3.0, 180.0, 0.8, 0.9, 40.0, True),  # 3.72 / 220 beats 3 / 180
    (3.0, 180.0, 0.5, 0.9, 40.0, False),  # deeper: reaching the token is less likely
    (1.0, 100.0, 1.0, 0.5, 50.0, False),  # a tie is not worth a draft forward
])
def test_worth_drafting(gain, ms, reach, chance, more_ms, want):
    assert worth_drafting(gain, ms, reach, chance, more_ms) is want


# ---- trie merging with caps ---------------------------------------------------------------------------
def test_trie_merging_with_caps():
    t = StepTree.root(0)
    assert t.add_chain([1, 2, 3], PLD, max_nodes=4) == [1, 2, 3]
    assert t.add_chain([1, 2, 4, 5], POOL, max_nodes=4) == [1, 2, 4]  # 5 would be the 5th candidate
    assert t.add_chain([6], POOL, max_nodes=4) == []
    assert t.add_chain([1, 2, 3], POOL, max_nodes=4) == [1, 2, 3]  # shared nodes are free
    assert t.tokens == [0, 1, 2, 3, 4]
    assert t.sources == [0, PLD | POOL, PLD | POOL, PLD | POOL, POOL]
    t.add_private_chain(0, [7, 8], WINDOW)  # private nodes are not candidates and cost no cap
    assert t.num_candidates == 4 and t.children[0] == {1: 1}
    assert t.logit_nodes() == [0, 1, 2, 3, 4]  # private nodes need logits only when asked for
    t.extra_logits.add(6)
    assert t.logit_nodes() == [0, 1, 2, 3, 4, 6]


def test_subtree_keeps_nodes_and_maps_them_back():
    t = StepTree.root(0)
    t.add_chain([1, 2, 3], PLD)  # nodes 1, 2, 3
    t.add_chain([1, 5], POOL)  # node 4
    w = t.add_private_chain(0, [7], WINDOW, group=0) + t.add_private_chain(0, [8, 9], WINDOW, group=1)
    t.extra_logits.update(w)
    sub, origin = t.subtree([0, 1, 4, 6])
    assert origin == [0, 1, 4, 6]
    assert sub.tokens == [0, 1, 5, 8] and sub.parents == [-1, 0, 1, 0] and sub.depths == [0, 1, 2, 1]
    assert sub.sources == [0, PLD | POOL, POOL, WINDOW] and sub.group == [-1, -1, -1, 1]
    assert sub.children == [{1: 1}, {5: 2}, {}, {}] and sub.extra_logits == {3}
    assert sub.logit_nodes() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="parent"):
        t.subtree([0, 2])


@pytest.mark.parametrize("seed", range(20))
def test_subtree_is_the_tree_rebuilt_node_by_node(seed):
    """``subtree`` (built field by field) equals growing the kept nodes one by one with ``_new``."""
    import random

    rng = random.Random(seed)
    t = StepTree.root(rng.randrange(5))
    for _ in range(rng.randrange(1, 8)):
        t.add_chain([rng.randrange(4) for _ in range(rng.randrange(1, 5))], rng.choice([PLD, POOL, WINDOW]))
        if rng.random() < 0.4:
            t.add_private_chain(rng.randrange(len(t)), [rng.randrange(9)], WINDOW, group=rng.randrange(3))
    keep = [0] + [n for n in range(1, len(t)) if rng.random() < 0.6]
    keep = [n for n in keep if n == 0 or all(a in keep for a in _ancestors(t, n))]
    want = StepTree.root(t.tokens[0])
    new_of = {old: new for new, old in enumerate(keep)}
    for old in keep[1:]:
        want._new(new_of[t.parents[old]], t.tokens[old], t.sources[old], t.candidate[old], t.group[old])
    assert t.subtree(keep)[0] == want


def _ancestors(t: StepTree, n: int) -> list[int]:
    out = []
    while t.parents[n] >= 0:
        n = t.parents[n]
        out.append(n)
    return out


# ---- token recycling ------------------------------------------------------------------------------------
def test_recycle_seed_table_from_text():
    assert seed_table([1, 2, 1, 3, 1, 2, 4], top_k=2) == {1: [2, 3], 2: [4, 1], 3: [1]}


def test_recycle_refresh_puts_later_rows_last():
    table = {1: [5, 6]}
    refresh(table, [1, 2, 1], [[7, 8], [9, 9], [3, 4]])
    assert table == {1: [3, 4], 2: [9, 9]}


def test_recycle_tree_is_breadth_first_with_widths():
    table = {0: [1, 2, 3], 1: [4, 5], 2: [6, 1], 4: [7], 6: [8]}
    t = StepTree.root(0)
    grow_recycled(t, table, widths=(2, 2, 1), max_depth=5, max_nodes=10)
    # depth 1: 1, 2 (width 2 of [1, 2, 3]); depth 2: 1 -> 4, 5; 2 -> 6, 1; depth 3: 4 -> 7, 6 -> 8, 1 -> 4
    assert t.tokens == [0, 1, 2, 4, 5, 6, 1, 7, 8, 4]
    assert t.parents == [-1, 0, 0, 1, 1, 2, 2, 3, 5, 6]
    assert all(s == RECYCLE for s in t.sources[1:])
    t = StepTree.root(0)
    grow_recycled(t, table, widths=(2, 2, 1), max_depth=1, max_nodes=10)
    assert t.tokens == [0, 1, 2]
    t = StepTree.root(0)
    grow_recycled(t, table, widths=(2, 2, 1), max_depth=5, max_nodes=3)
    assert t.tokens == [0, 1, 2, 4]


# ---- suffix trie ------------------------------------------------------------------------------------------
def test_suffix_trie_counts_substrings():
    trie = SuffixTrie(depth=3)
    trie.extend([1, 2, 1, 2, 3])
    count = {(1,): 2, (2,): 2, (3,): 1, (1, 2): 2, (2, 1): 1, (2, 3): 1, (1, 2, 1): 1, (1, 2, 3): 1,
             (2, 1, 2): 1}
    for sub, n in count.items():
        assert trie.occurrences(trie.find(list(sub))) == n, sub
    assert trie.find([1, 2, 1, 2]) is None and trie.find([3, 1]) is None  # deeper than depth; never seen
    # only what occurred more than once is a node (the root too); the rest are places in the text
    assert len(trie) == 1 + 3 and trie.find([2, 1, 2]) == (3, 3)
    # the nodes among the suffixes ending at the end of the stream, shortest first (own_match reads
    # them longest first); "3", "2 3", "1 2 3" occurred only there
    assert trie.active == [0]
    trie = SuffixTrie(depth=3)
    trie.extend([1, 2, 1, 2])
    assert trie.active == [0, trie.find([2]), trie.find([1, 2])]


class _Dense:
    """Reference for SuffixTrie: every substring's count and last end, by brute force."""

    def __init__(self, streams: list[list[int]], depth: int):
        self.depth, self.count, self.last = depth, {}, {}
        at = 0
        for text in streams:
            for j in range(len(text)):
                for i in range(max(0, j + 1 - depth), j + 1):
                    sub = tuple(text[i:j + 1])
                    self.count[sub] = self.count.get(sub, 0) + 1
                    self.last[sub] = at + j
            at += len(text) + 1

    def continuations(self, sub: tuple) -> list:
        kids = [(sub + (y,), n) for (*s, y), n in self.count.items() if tuple(s) == sub]
        kids.sort(key=lambda k: (-k[1], -self.last[k[0]]))  # most frequent, then the latest
        return [(s[-1], s, n) for s, n in kids]

    def match(self, text: list[int], max_match: int):
        for m in range(min(max_match, len(text)), 0, -1):
            if self.continuations(tuple(text[-m:])):
                return tuple(text[-m:])
        return None


@pytest.mark.parametrize("seed", range(6))
def test_suffix_trie_matches_brute_force_counts(seed):
    """Counts, matches and grown trees of the compressed trie against every substring counted
    by brute force, over random streams with many repeats (small vocabularies) and few."""
    import random

    rng = random.Random(seed)
    for _ in range(25):
        depth, vocab = rng.randint(2, 7), rng.randint(1, 5)
        trie, streams = SuffixTrie(depth), []
        for s in range(rng.randint(1, 3)):
            if s:
                trie.new_stream()
            streams.append([])
            for _ in range(rng.randint(1, 4)):
                chunk = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
                trie.extend(chunk)
                streams[-1] += chunk
                ref = _Dense(streams, depth)
                unseen = [tuple(rng.randrange(vocab) for _ in range(rng.randint(1, depth + 1))) for _ in range(20)]
                for sub in list(ref.count) + unseen:
                    assert trie.occurrences(trie.find(list(sub))) == ref.count.get(sub, 0), sub
                max_match = rng.randint(1, depth - 1)
                query = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
                own = trie.own_match(max_match)
                want = ref.match(streams[-1], max_match)
                assert (own is None) == (want is None) and (own is None or trie.find(list(want)) == own)
                for place, sub in ((own, want), (trie.store_match(query, max_match), ref.match(query, max_match))):
                    assert (place is None) == (sub is None)
                    if place is None:
                        continue
                    assert trie.length(place) == len(sub) and trie.find(list(sub)) == place
                    for max_depth, max_nodes, min_prob in ((3, 8, 0.2), (5, 30, 0.0)):
                        got, exp = StepTree.root(9), StepTree.root(9)
                        grow_suffix(got, trie, place, max_depth, max_nodes, min_prob)
                        grow_suffix(exp, ref, sub, max_depth, max_nodes, min_prob)
                        assert (got.tokens, got.parents) == (exp.tokens, exp.parents)


@pytest.mark.parametrize("bad, match", [
    (dict(max_match=0), "max_match"), (dict(depth=8, max_match=8), "max_match < depth"),
    (dict(max_nodes=0), "max_nodes must be >= 1"), (dict(min_prob=1.0), r"min_prob must be in \[0, 1\)"),
    (dict(store_nodes=0), "store_nodes must be >= 1"),
])
def test_suffix_config_names_the_bad_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        SuffixConfig(**bad)


def test_a_full_suffix_trie_takes_no_more_text():
    trie = SuffixTrie(depth=4, max_nodes=40)
    trie.extend([1, 2, 3] * 30)
    assert 40 <= trie.size < 40 + 4 + 2  # one token's entries past the bound at most
    size, text = trie.size, len(trie.text)
    trie.extend([1, 2])
    assert (trie.size, len(trie.text)) == (size, text)
    assert trie.occurrences(trie.find([1, 2, 3])) >= 2


def test_suffix_match_and_tree():
    trie = SuffixTrie(depth=6)
    trie.extend([5, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 4, 0, 1, 2])
    m = trie.own_match(max_match=4)
    assert trie.level[m] == 2 and trie.find([1, 2]) == m  # "3 1 2" never occurred before; "1 2" did
    t = StepTree.root(2)
    grow_suffix(t, trie, m, max_depth=3, max_nodes=8, min_prob=0.2)
    # after "1 2": 3 twice, 4 once -> 3 (2/3), 4 (1/3); after "1 2 3": 7, 9 (1/3 each; 7 followed
    # it last); after "1 2 4": 0 (1/3); then each of those continues with 1 (1/3), best first,
    # ties in the order their parents were taken
    assert t.tokens == [2, 3, 4, 7, 9, 0, 1, 1, 1] and t.parents == [-1, 0, 0, 1, 1, 2, 3, 4, 5]
    t = StepTree.root(2)
    grow_suffix(t, trie, m, max_depth=3, max_nodes=8, min_prob=0.34)  # every 1/3 path is dropped
    assert t.tokens == [2, 3]
    t = StepTree.root(2)
    grow_suffix(t, trie, m, max_depth=3, max_nodes=3, min_prob=0.0)  # the node cap
    assert t.tokens == [2, 3, 4, 7]


def test_suffix_store_sees_other_streams_only_when_shared():
    trie = SuffixTrie(depth=4)
    trie.extend([1, 2, 3])
    trie.new_stream()
    trie.extend([4, 5])
    assert trie.find([3, 4]) is None  # no substring spans two streams
    assert trie.store_match([9, 9, 1, 2], max_match=3) == trie.find([1, 2])
    assert trie.store_match([9, 9], max_match=3) is None


def test_draft_sizing_looks_past_a_dip_in_the_cost_curve():
    """A step of 3 tokens dearer than one of 4 (measured so on this CPU for the 1.5B model):
    one more draft token does not pay, two do, so the chain goes on."""
    from decoding.draft import DraftModel

    prop = DraftModel.__new__(DraftModel)
    prop.token_ms = 50.0
    curve = {1: 350.0, 2: 350.0, 3: 500.0, 4: 350.0, 5: 520.0}
    gain, reach, p = 1.9, 0.9, 0.9  # one draft token so far
    assert not worth_drafting(gain, 350 + 50, reach, p, 50 + 150)  # the next token alone
    assert prop._worth(lambda n: curve[n], 1, gain, reach, p, 1)
    flat = {1: 350.0, 2: 350.0, 3: 700.0, 4: 700.0, 5: 700.0}
    assert not prop._worth(lambda n: flat[n], 1, gain, reach, p, 1)


@pytest.mark.parametrize("seed", range(10))
def test_step_statistics_count_every_sent_candidate_per_source(seed):
    """SeqStats.record (counted by bit set first) against a count node by node, bit by bit."""
    import random
    from collections import Counter
    from types import SimpleNamespace

    from decoding.stats import SeqStats
    from decoding.tree import SOURCE_NAMES

    rng = random.Random(seed)
    t = StepTree.root(0)
    for _ in range(rng.randrange(1, 12)):
        chain = [rng.randrange(3) for _ in range(rng.randrange(1, 5))]
        t.add_chain(chain, rng.choice([PLD, POOL, PLD | POOL, 64, 128]))
        if rng.random() < 0.3:
            t.add_private_chain(0, [rng.randrange(9)], WINDOW)
    path, node = [0], 0
    while t.children[node] and rng.random() < 0.7:
        node = rng.choice(list(t.children[node].values()))
        path.append(node)
    rows = {n: i for i, n in enumerate(n for n in range(len(t)) if rng.random() < 0.8 or n in path)}
    outcome = SimpleNamespace(tree=t, path=path, rows=rows, sent=len(t), new_tokens=[1] * len(path))
    stats = SeqStats()
    stats.record(outcome)
    proposed, accepted = Counter(), Counter()
    for n in rows:
        if n and t.candidate[n]:
            for bit, name in SOURCE_NAMES.items():
                if t.sources[n] & bit:
                    proposed[name] += 1
                    accepted[name] += n in path
    assert stats.proposed == +proposed and stats.accepted == +accepted


@pytest.mark.parametrize("seed", range(10))
def test_harvest_closes_the_columns_written_level_by_level(seed):
    """``harvest`` (columns read at once) against the rule written plainly, on random windows."""
    import random

    rng = random.Random(seed)
    W, n_levels = rng.randrange(2, 9), rng.randrange(1, 6)
    levels = [[rng.randrange(50) for _ in range(W)] for _ in range(n_levels)]
    real = [[rng.random() < 0.8 for _ in range(W)] for _ in range(n_levels)]
    new = [None if rng.random() < 0.2 else rng.randrange(50) for _ in range(W)]
    want = []
    for c, tip in enumerate(new):
        if tip is not None and all(real[j][c] for j in range(1 if c == 0 else 0, n_levels)):
            want.append((7 if c == 0 else levels[0][c], *(levels[j][c] for j in range(1, n_levels)), tip))
    assert harvest(7, levels, real, new) == want
