"""decoding/cpu/tables.c (decoding/compiled_draft.py's CNgramPool, CTable, CHistory) against their
Python references: NgramPool and Lookahead.propose's pool loop, recycle.seed_table / refresh /
grow_tree and init_state's setdefault merge, ngram_match_lists and prompt lookup's add_chain
loop. Equal contents in equal order, and equal step trees (StepTree ==), on exact examples and
random inputs over small vocabularies (so that n-grams repeat)."""

import random
from array import array

import pytest

from decoding import compiled_draft
from decoding.compiled_draft import CHistory, CNgramPool, CTable, TreeBuf, _ptr
from decoding.ngram_pool import NgramPool
from decoding.recycle import grow_tree, refresh, seed_table
from decoding.tree import HARVEST, PLD, POOL, RECYCLE, SUFFIX, WINDOW, StepTree
from kernels.ngram_match import ngram_match_lists

LIB = compiled_draft.LIBRARY.get()
pytestmark = pytest.mark.skipif(LIB is None, reason=f"not built: {compiled_draft.LIBRARY.reason}")


def tree_pair(rng: random.Random, root: int, vocab: int, filled: bool = True) -> tuple[StepTree, TreeBuf]:
    """The same tree as a StepTree and in a TreeBuf: the root, and when ``filled`` a few chains
    and a private chain made the same way on both."""
    ref, buf = StepTree.root(root), TreeBuf(512)
    assert LIB.tree_reset(buf.ref, root) == 0
    for _ in range(rng.randrange(4) if filled else 0):
        chain = [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
        a = array("i", chain)
        if rng.random() < 0.2:
            ref.add_private_chain(0, chain, WINDOW, group=0)
            LIB.tree_add_private(buf.ref, 0, _ptr(a), len(a), WINDOW, 0, None)
        else:
            src = rng.choice([PLD, SUFFIX])
            ref.add_chain(chain, src)
            LIB.tree_add_chain(buf.ref, _ptr(a), len(a), src, -1, None)
    assert buf.step_tree() == ref
    return ref, buf


# ---- the n-gram pool -----------------------------------------------------------------------
def test_pool_exact():
    p = CNgramPool(3, 2)
    p.add((1, 2, 3))
    p.add([1, 4, 5], HARVEST)
    p.add((1, 2, 3), HARVEST)  # refreshed: moves to the end, stays POOL
    p.add((1, 2))  # wrong length: nothing
    assert p.items(1) == [((2, 3), POOL), ((4, 5), HARVEST)]
    p.add((1, 6, 7), HARVEST)  # (4, 5) is the least recent: out
    assert p.items(1) == [((6, 7), HARVEST), ((2, 3), POOL)]
    assert p.get(1) == [(6, 7), (2, 3)] and p.get(9) == [] and len(p) == 2
    p.add_all([5, 1, 2, 3, 8], start=4)  # the n-grams holding the token at index 4: (2, 3, 8)
    assert p.items(2) == [((3, 8), POOL)] and len(p) == 3
    buf = TreeBuf(16)
    LIB.tree_reset(buf.ref, 1)
    assert p.add_chains(buf, 1, guesses=2, max_depth=1, max_nodes=8) == 2
    t = buf.step_tree()
    assert (t.tokens, t.parents, t.sources) == ([1, 6, 2], [-1, 0, 0], [0, HARVEST, POOL])


def test_pool_random():
    rng = random.Random(1)
    for trial in range(150):
        n, cap, vocab = rng.randrange(1, 6), rng.randrange(-1, 6), rng.randrange(2, 6)
        ref, c = NgramPool(n, cap), CNgramPool(n, cap)
        for _ in range(rng.randrange(1, 40)):
            if rng.random() < 0.45:
                ngram = tuple(rng.randrange(vocab) for _ in range(n if rng.random() < 0.9 else rng.randrange(1, 7)))
                origin = rng.choice([POOL, HARVEST])
                ref.add(ngram, origin)
                c.add(ngram, origin)
            elif rng.random() < 0.3:  # several at once (the window's harvest)
                ngrams = [tuple(rng.randrange(vocab) for _ in range(n if rng.random() < 0.9 else rng.randrange(1, 7)))
                          for _ in range(rng.randrange(0, 8))]
                origin = rng.choice([POOL, HARVEST])
                ref.add_many(ngrams, origin)
                c.add_many(ngrams, origin)
            else:
                tokens = [rng.randrange(vocab) for _ in range(rng.randrange(12))]
                start = rng.randrange(-2, len(tokens) + 3)
                ref.add_all(tokens, start)
                c.add_all(tokens, start)
            assert len(c) == len(ref)
        for key in range(-1, vocab + 1):
            assert c.items(key) == ref.items(key) and c.get(key) == ref.get(key)
        for _ in range(8):  # Lookahead.propose's pool loop, into a tree that may hold nodes already
            key = rng.randrange(vocab)
            guesses, d = rng.randrange(-1, 8), rng.randrange(0, 7)
            max_nodes = rng.choice([None, rng.randrange(0, 12)])
            t, buf = tree_pair(rng, key, vocab)
            for ngram, origin in ref.items(key)[:guesses]:
                t.add_chain(list(ngram[:d]), origin, max_nodes)
            c.add_chains(buf, key, guesses, d, max_nodes)
            assert buf.step_tree() == t, (trial, key, guesses, d, max_nodes)


def test_pool_tree_full():
    p = CNgramPool(4, 3)
    p.add_all([1, 2, 3, 4, 1, 5, 6, 7, 1, 8, 9, 9])
    buf = TreeBuf(4)
    LIB.tree_reset(buf.ref, 1)
    with pytest.raises(RuntimeError, match="full"):
        p.add_chains(buf, 1, 3, 3, None)


# ---- the recycled table --------------------------------------------------------------------
def assert_same(c: CTable, ref: dict, vocab: int) -> None:
    assert c.items() == list(ref.items()) and len(c) == len(ref)
    for tok in range(-1, vocab + 1):
        assert c.get(tok, "none") == ref.get(tok, "none") and (tok in c) == (tok in ref)


def test_table_exact():
    c = CTable(2)
    c.seed([1, 2, 1, 3, 1, 2])
    assert c.items() == [(1, [2, 3]), (2, [1]), (3, [1])]
    shared = CTable(2)
    shared.refresh([2], [[9, 8]])
    assert c.merge_into(shared) == 2  # 2's row stays the model's
    assert shared.items() == [(2, [9, 8]), (1, [2, 3]), (3, [1])]
    assert shared[1] == [2, 3] and 4 not in shared and shared.get(4) is None
    with pytest.raises(KeyError):
        shared[4]
    shared.refresh([1, 3, 1], [[3, 4], [5, 6], [7, 7]])  # later rows win
    assert shared.items() == [(2, [9, 8]), (1, [7, 7]), (3, [5, 6])]
    toks, rows = array("i", [4, 2]), array("i", [1, 1, 2, 2])
    shared.refresh_at(_ptr(toks), _ptr(rows), 2, 2)
    assert shared.items() == [(2, [2, 2]), (1, [7, 7]), (3, [5, 6]), (4, [1, 1])]
    buf = TreeBuf(16)
    LIB.tree_reset(buf.ref, 1)
    c.grow(buf, (2, 1), max_depth=5, max_nodes=10)
    t = buf.step_tree()
    assert (t.tokens, t.parents, t.depths) == ([1, 2, 3, 1, 1], [-1, 0, 0, 1, 2], [0, 1, 1, 2, 2])
    assert set(t.sources[1:]) == {RECYCLE}
    with pytest.raises(ValueError):
        shared.refresh([1], [[1, 2, 3]])  # longer than top_k


def test_table_random():
    rng = random.Random(2)
    for trial in range(150):
        K, vocab = rng.randrange(1, 6), rng.randrange(2, 9)
        shared_ref, shared = {}, CTable(K)
        if rng.random() < 0.5:  # the shared table holds the model's rows already
            toks = [rng.randrange(vocab) for _ in range(rng.randrange(6))]
            k = rng.randrange(K + 1)
            rows = [[rng.randrange(vocab) for _ in range(k)] for _ in toks]
            refresh(shared_ref, toks, rows)
            shared.refresh(toks, rows)
        for _ in range(rng.randrange(1, 3)):  # init_state: seed a fresh table, setdefault into the shared
            prompt = [rng.randrange(vocab) for _ in range(rng.randrange(30))]
            seeded, c = seed_table(prompt, K), CTable(K)
            c.seed(prompt)
            assert_same(c, seeded, vocab)
            for tok, row in seeded.items():
                shared_ref.setdefault(tok, row)
            c.merge_into(shared)
            assert_same(shared, shared_ref, vocab)
        for _ in range(rng.randrange(4)):  # learn_from's refresh, and seeding a table that has rows
            if rng.random() < 0.7:
                toks = [rng.randrange(vocab) for _ in range(rng.randrange(8))]
                k = rng.randrange(K + 1)
                rows = [[rng.randrange(vocab) for _ in range(k)] for _ in toks]
                refresh(shared_ref, toks, rows)
                shared.refresh(toks, rows)
            else:
                more = [rng.randrange(vocab) for _ in range(rng.randrange(10))]
                seed_table(more, K, shared_ref)
                shared.seed(more)
            assert_same(shared, shared_ref, vocab)
        for _ in range(6):
            widths = tuple(rng.randrange(1, K + 1) for _ in range(rng.randrange(1, 8)))
            d, max_nodes = rng.randrange(0, 7), rng.choice([None, rng.randrange(0, 20)])
            t, buf = tree_pair(rng, rng.randrange(vocab), vocab)
            grow_tree(t, shared_ref, widths, d, max_nodes)
            shared.grow(buf, widths, d, max_nodes)
            assert buf.step_tree() == t, (trial, widths, d, max_nodes)


# ---- the prompt-lookup history -------------------------------------------------------------
def test_history_exact():
    h = CHistory([1, 2, 3, 1, 2])
    h.extend([4, 1, 2])
    assert len(h) == 8
    kw = dict(min_n=1, max_n=2, k=2, num_candidates=3)
    assert h.search(**kw) == [[3, 1], [4, 1]]
    assert h.search(**kw, prefer="recent") == [[4, 1], [3, 1]]
    assert h.search(**kw, partial=False) == [[3, 1], [4, 1]]
    assert h.search(min_n=1, max_n=1, k=3, num_candidates=1, partial=False) == [[3, 1, 2]]
    buf = TreeBuf(16)
    LIB.tree_reset(buf.ref, 2)
    assert h.add_to_tree(buf, **kw, max_depth=1, max_nodes=8) == 2
    t = buf.step_tree()
    assert (t.tokens, t.parents, t.sources) == ([2, 3, 4], [-1, 0, 0], [0, PLD, PLD])
    h.truncate(3)
    assert h.search(**kw) == [] and len(h) == 3
    with pytest.raises(ValueError):
        h.search(min_n=2, max_n=1, k=1)
    with pytest.raises(ValueError):
        h.search(min_n=1, max_n=1, k=1, prefer="last")


ARGS = [dict(min_n=lo, max_n=hi, k=k, num_candidates=nc, prefer=pr, partial=pa)
        for lo in (1, 2, 3) for hi in range(lo, 5) for k in range(1, 11) for nc in range(1, 5)
        for pr in ("first", "recent") for pa in (True, False)]


def test_history_search_random():
    rng = random.Random(3)
    for trial in range(25):
        vocab = rng.randrange(2, 5)
        hist, c = [], CHistory()
        for _ in range(rng.randrange(1, 4)):  # grown a few tokens at a time
            more = [rng.randrange(vocab) for _ in range(rng.randrange(15))]
            hist += more
            c.extend(more) if rng.random() < 0.5 else c.sync(hist)
        assert len(c) == len(hist)
        for kw in ARGS:
            assert c.search(**kw) == ngram_match_lists([hist], **kw)[0], (trial, hist, kw)


def test_history_add_to_tree_random():
    rng = random.Random(4)
    for trial in range(600):
        vocab = rng.randrange(2, 5)
        hist = [rng.randrange(vocab) for _ in range(rng.randrange(40))]
        c = CHistory(hist)
        kw = rng.choice(ARGS)
        d, max_nodes = rng.randrange(0, 7), rng.choice([None, rng.randrange(0, 16)])
        t, buf = tree_pair(rng, hist[-1] if hist else 0, vocab)
        for chain in ngram_match_lists([hist], **kw)[0]:
            t.add_chain(chain[:d], PLD, max_nodes)
        c.add_to_tree(buf, **kw, max_depth=d, max_nodes=max_nodes)
        assert buf.step_tree() == t, (trial, hist, kw, d, max_nodes)


def test_history_long():
    """Histories of a few thousand tokens from a larger vocabulary, grown step by step."""
    rng = random.Random(5)
    base = [rng.randrange(50) for _ in range(300)]
    hist, c = [], CHistory()
    while len(hist) < 3000:
        if rng.random() < 0.3:  # a copy of earlier text: long matches
            i = rng.randrange(len(base) - 20)
            more = base[i:i + rng.randrange(1, 20)]
        else:
            more = [rng.randrange(50) for _ in range(rng.randrange(1, 6))]
        hist += more
        base += more
        c.extend(more)
        kw = rng.choice(ARGS)
        assert c.search(**kw) == ngram_match_lists([hist], **kw)[0]


class _Outcome:
    """What learn_from reads of a step's outcome."""

    def __init__(self, tokens, rows, path, top):
        self.tree, self.rows, self.path, self._top = StepTree(tokens=tokens), rows, path, top

    def top_rows(self, k):
        return self._top


@pytest.mark.parametrize("glue", [True, False], ids=["c-glue", "python-glue"])
def test_learn_from_refreshes_a_compiled_table_as_the_dict(glue):
    """recycle.learn_from on a compiled table, through decoding/cpu/glue.c (every row in the
    reference's order into table_refresh) or the Python fold, against the dict reference:
    the same rows in the same order, over random steps whose nodes repeat tokens, rows given in
    any order, accepted paths anywhere."""
    from decoding import compiled
    from decoding.recycle import learn_from

    if glue and compiled.glue() is None:
        pytest.skip(f"the C glue did not build: {compiled.EXT.reason}")
    before = compiled.use_extension(glue)
    calls = {"glue": 0}
    try:
        rng = random.Random(7)
        for trial in range(200):
            K, vocab = rng.randrange(1, 6), rng.randrange(2, 9)
            ref, table = {}, CTable(K)
            for step in range(rng.randrange(1, 5)):
                n = rng.randrange(1, 30)
                tokens = [rng.randrange(vocab) for _ in range(n)]
                nodes = sorted(rng.sample(range(n), rng.randrange(0, n + 1)))
                if rng.random() < 0.3:
                    rng.shuffle(nodes)  # a dict in another order than the nodes'
                order = list(range(len(nodes)))
                rng.shuffle(order)
                rows = dict(zip(nodes, order))
                path = [0] + sorted(rng.sample(range(1, n), rng.randrange(0, min(4, n - 1) + 1)))
                k = rng.randrange(K + 1)
                top = [[rng.randrange(vocab) for _ in range(k)] for _ in nodes]
                out = _Outcome(tokens, rows, path, top)
                learn_from(ref, out, K)
                done = table.learn(tokens, rows, path, top) if glue else False
                calls["glue"] += done
                if not done:
                    learn_from(table, out, K)
                assert_same(table, ref, vocab)
        assert not glue or calls["glue"] > 300
        with pytest.raises(ValueError, match="one length"):  # rows of two lengths: the Python glue says so
            learn_from(CTable(3), _Outcome([1, 2], {0: 0, 1: 1}, [0], [[1], [1, 2]]), 3)
    finally:
        compiled.use_extension(before)


@pytest.mark.parametrize("glue", [True, False], ids=["c-glue", "python-glue"])
def test_the_lookahead_window_updates_a_compiled_pool_as_the_reference(glue):
    """Lookahead.update on the compiled path (decoding/cpu/glue.c ``window_update``, or the Python
    fold over the compiled pool) against the reference (lists and NgramPool): the same pool
    contents and window after random steps: windows of any shape with unreal levels, tips sent
    or not (or no window), the pool learning from the output or not, few distinct tokens so that
    n-grams repeat and refresh. A window the glue does not take (a level of another width) leaves
    the pool as it was and the Python fold runs."""
    import torch

    from decoding import compiled
    from decoding.lookahead import Lookahead, LookaheadConfig
    from decoding.proposer import Outcome, SeqState

    if glue and compiled.glue() is None:
        pytest.skip(f"the C glue did not build: {compiled.EXT.reason}")
    rng = random.Random(11)
    calls = {"glue": 0}
    real_update = CNgramPool.window_update

    def counted(self, *a):
        done = real_update(self, *a)
        calls["glue"] += done is not None
        return done
    before = compiled.use_extension(glue)
    CNgramPool.window_update = counted
    try:
        for trial in range(150):
            W, N, vocab = rng.randrange(2, 7), rng.randrange(2, 6), rng.randrange(2, 6)
            cfg = LookaheadConfig(window=W, ngram=N, guesses=rng.randrange(0, 4),
                                  pool_from_output=rng.random() < 0.8)
            prompt = [rng.randrange(vocab) for _ in range(rng.randrange(2, 12))]
            states = []
            for on in (True, False):
                was = compiled.use_compiled(on)
                try:
                    p = Lookahead(cfg)
                    states.append((p, p.init_state(SeqState(0, list(prompt), len(prompt)))))
                finally:
                    compiled.use_compiled(was)
            (fast, fs), (ref, rs) = states
            assert fast.buf is not None and ref.buf is None
            for step in range(rng.randrange(1, 6)):
                levels = [[rng.randrange(vocab) for _ in range(W)] for _ in range(N - 1)]
                real = [[rng.random() < 0.8 for _ in range(W)] for _ in range(N - 1)]
                n_nodes = rng.randrange(1, 3 * W + 2)
                tips = None if rng.random() < 0.15 else [rng.randrange(n_nodes) for _ in range(W)]
                nodes = rng.sample(range(n_nodes), rng.randrange(0, n_nodes + 1))
                rows = {n: j for j, n in enumerate(nodes)}
                top1 = [rng.randrange(vocab) for _ in nodes]
                new = [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
                tree = StepTree.root(rng.randrange(vocab))
                for s in (fs, rs):
                    s.tokens += new
                    s.levels, s.real, s.tips = [list(lv) for lv in levels], [list(r) for r in real], tips
                if step == 3:  # a window the glue does not take: the Python fold, the pool untouched before it
                    fs.levels[-1] = fs.levels[-1] + [0]
                    rs.levels[-1] = rs.levels[-1] + [0]
                    fs.real[-1] = fs.real[-1] + [False]
                    rs.real[-1] = rs.real[-1] + [False]
                for p, s in ((fast, fs), (ref, rs)):
                    out = Outcome(tree=tree, path=[0], new_tokens=list(new), logits=torch.zeros(len(nodes), vocab),
                                  rows=dict(rows), sent=n_nodes).reduced(list(top1), None)
                    p.update(s, out)
                assert fs.levels == rs.levels and fs.real == rs.real, (trial, step)
                assert len(fs.pool) == len(rs.pool), (trial, step)
                for key in range(vocab):
                    assert fs.pool.items(key) == rs.pool.items(key), (trial, step, key)
        assert not glue or calls["glue"] > 300
    finally:
        CNgramPool.window_update = real_update
        compiled.use_extension(before)


@pytest.mark.parametrize("glue", [True, False], ids=["c-glue", "python-glue"])
def test_extend_from_appends_a_lists_tail_as_extend_of_the_slice(glue):
    """CHistory.extend_from / CSuffixTrie.extend_from (a step's new tokens, read from the
    sequence's list in place by the C glue's append_tail) against extend of the slice and the
    reference trie: the same tokens, searches and text, from lists short and long (the glue's
    own buffer and a heap one), any other sequence taken by the Python glue, nothing appended
    where an item is not a token."""
    from decoding import compiled
    from decoding.suffix import SuffixTrie

    if glue and compiled.glue() is None:
        pytest.skip(f"the C glue did not build: {compiled.EXT.reason}")
    before = compiled.use_extension(glue)
    try:
        rng = random.Random(11)
        for trial in range(60):
            depth = rng.randrange(2, 6)
            hist, by_slice = CHistory(), CHistory()
            trie, ref = compiled_draft.CSuffixTrie(depth), SuffixTrie(depth)
            tokens: list[int] = []
            for step in range(rng.randrange(1, 6)):
                start = len(tokens)
                tokens += [rng.randrange(5) for _ in range(rng.choice([0, 1, 3, 70, 200]))]
                seq = tokens if rng.random() < 0.8 else tuple(tokens)
                hist.extend_from(seq, start)
                by_slice.extend(tokens[start:])
                trie.extend_from(seq, start)
                ref.extend_from(tokens, start)
                assert len(hist) == len(by_slice) == len(tokens)
                for n in (1, 2, 3):
                    assert hist.search(min_n=1, max_n=n, k=4, num_candidates=3) == \
                        by_slice.search(min_n=1, max_n=n, k=4, num_candidates=3)
                assert trie.text == ref.text == tokens and len(trie) == len(ref)
        for bad in ([1, 2, "x"], [1, 2, 2 ** 40]):
            hist, trie = CHistory([7]), compiled_draft.CSuffixTrie(3)
            with pytest.raises((TypeError, OverflowError)):
                hist.extend_from(bad, 1)
            with pytest.raises((TypeError, OverflowError)):
                trie.extend_from(bad, 1)
            assert len(hist) == 1 and trie.text == []
        for bad in (-1, 4, 1.0, True):  # start outside the list (or not an integer): named, nothing fed
            hist, trie, ref = CHistory([7]), compiled_draft.CSuffixTrie(3), SuffixTrie(3)
            for target in (hist, trie, ref):
                with pytest.raises(ValueError, match=r"start must be an integer in \[0, 3\]"):
                    target.extend_from([1, 2, 3], bad)
            assert len(hist) == 1 and trie.text == [] and ref.text == []
    finally:
        compiled.use_extension(before)
