"""The compiled suffix trie (decoding/cpu/suffix.c, ``compiled_draft.CSuffixTrie``) against its
Python reference (decoding/suffix.py's ``SuffixTrie`` and ``grow_tree``): the same sizes, nodes,
places and continuations after every extend, and the same step trees, on an exact example and on
random streams whose small vocabulary makes repeats."""

import random
from array import array

import pytest

from decoding import compiled_draft
from decoding.compiled_draft import CSuffixTrie, TreeBuf
from decoding.suffix import SuffixTrie, grow_tree
from decoding.tree import PLD, POOL, STORE, SUFFIX, WINDOW, StepTree

LIB = compiled_draft.LIBRARY.get()
pytestmark = pytest.mark.skipif(LIB is None, reason=f"not built: {compiled_draft.LIBRARY.reason}")


def _ptr(a: array) -> int:
    return a.buffer_info()[0]


def test_exact_continuations():
    t = CSuffixTrie(depth=3)
    t.extend([1, 2, 1, 2, 3])
    # nodes in creation order: "1" (1), "2" (2), "1 2" (3); the rest seen once. Size: the root, 5
    # tokens, 8 once-seen entries made (3 of them a new node's first continuation), 3 nodes
    assert len(t) == 4 and [t.find(s) for s in ([1], [2], [1, 2])] == [1, 2, 3] and t.size == 1 + 5 + 8 + 3
    # most frequent first; ties: the one that occurred last first ("2" last ended at 3, "1" at 2)
    assert t.continuations(0) == [(2, 2, 2), (1, 1, 2), (3, (4, 1), 1)]
    assert t.continuations(1) == [(2, 3, 2)]
    assert t.continuations(3) == [(3, (4, 3), 1), (1, (2, 3), 1)]  # "1 2 3" ended later than "1 2 1"
    assert t.continuations(2) == [(3, (4, 2), 1), (1, (2, 2), 1)]
    assert t.continuations((2, 2)) == [(2, (3, 3), 1)]  # "2 1" (ending at 2) then "2"
    assert t.continuations((2, 3)) == [] and t.continuations((4, 1)) == []  # depth; the text's end
    assert t.find([2, 1, 2]) == (3, 3) and t.find([3, 1]) is None and t.find([1, 2, 1, 2]) is None
    assert [t.occurrences(t.find(s)) for s in ([1], [1, 2], [2, 1], [9])] == [2, 2, 1, 0]
    assert t.length(3) == 2 and t.length((4, 3)) == 3
    assert t.active == [0] and t.own_match(2) is None and t.text == [1, 2, 1, 2, 3]
    t.new_stream()
    t.extend([2, 1])
    # "2 1" is a node now (4), the suffixes "1" and "2 1" active; "2 1" was followed by "2"
    assert t.text == [1, 2, 1, 2, 3, -1, 2, 1] and t.active == [0, 1, 4] and t.continuations(4) == [(2, (3, 3), 1)]
    assert (t.own_match(2), t.own_match(1), t.store_match([7, 2, 1], 3), t.store_match([3, 1], 3)) == (4, 1, 4, 1)


def test_exact_tree():
    tokens = [5, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 4, 0, 1, 2]
    t = CSuffixTrie(depth=6)
    t.extend(tokens)
    m = t.own_match(max_match=4)
    assert t.length(m) == 2 and t.find([1, 2]) == m
    buf = TreeBuf(64)
    LIB.tree_reset(buf.ref, 2)
    t.grow(buf, m, max_depth=3, max_nodes=8, min_prob=0.2, source=SUFFIX)
    tree = buf.step_tree()
    assert tree.tokens == [2, 3, 4, 7, 9, 0, 1, 1, 1] and tree.parents == [-1, 0, 0, 1, 1, 2, 3, 4, 5]
    assert tree.sources == [0] + [SUFFIX] * 8


def prefilled(rng: random.Random, vocab: int) -> tuple[StepTree, TreeBuf]:
    """The same tree in both forms: a root, maybe candidate chains of other sources and a private
    window column (a hybrid step grows the suffix trie's continuations after them)."""
    root = rng.randrange(vocab)
    ref, buf = StepTree.root(root), TreeBuf(256)
    LIB.tree_reset(buf.ref, root)
    for _ in range(rng.choice((0, 0, 1, 3))):
        chain = [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
        src = rng.choice((PLD, POOL, SUFFIX))
        ref.add_chain(chain, src)
        arr = array("i", chain)
        LIB.tree_add_chain(buf.ref, _ptr(arr), len(chain), src, -1, None)
    if rng.random() < 0.3:
        chain = [rng.randrange(vocab) for _ in range(3)]
        ref.add_private_chain(0, chain, WINDOW, group=0)
        arr = array("i", chain)
        LIB.tree_add_private(buf.ref, 0, _ptr(arr), len(chain), WINDOW, 0, None)
    return ref, buf


def places_of(rng: random.Random, ref: SuffixTrie) -> list:
    """Every node and a sample of once-seen places (continuations' and one step further)."""
    out = list(range(len(ref)))
    seen = [c for n in range(len(ref)) for _, c, _ in ref.continuations(n) if not isinstance(c, int)]
    for p in rng.sample(seen, min(len(seen), 12)):
        out.append(p)
        out.extend(c for _, c, _ in ref.continuations(p))
    return out


def check_grow(rng: random.Random, ref: SuffixTrie, fast: CSuffixTrie, places: list, matches: list,
               vocab: int) -> None:
    """grow into a TreeBuf == grow_tree into a StepTree, from any place and from the proposers'
    matches (the shallow places whose trees are wide and deep)."""
    for _ in range(6):
        tree, buf = prefilled(rng, vocab)
        max_depth = rng.randrange(0, 6)
        max_nodes = rng.choice((1, 2, 5, 12, 40, None))
        # 1/3, 1/2 and 1/4 are probabilities a path meets exactly: kept (not below)
        min_prob = rng.choice((0.0, 0.05, 0.2, 0.25, 1 / 3, 0.5))
        rounds = [SUFFIX] if rng.random() < 0.5 else [SUFFIX, STORE]  # a store grows a second time
        for source in rounds:
            place = rng.choice(matches if matches and rng.random() < 0.5 else places)
            grow_tree(tree, ref, place, max_depth, max_nodes, min_prob, source)
            fast.grow(buf, place, max_depth, max_nodes, min_prob, source)
        assert buf.step_tree() == tree, (place, max_depth, max_nodes, min_prob)


def check_equal(rng: random.Random, ref: SuffixTrie, fast: CSuffixTrie, vocab: int, tokens: list[int]) -> None:
    assert (fast.size, len(fast), fast.text, fast.active) == (ref.size, len(ref), ref.text, ref.active)
    for m in range(0, ref.depth + 2):
        assert fast.own_match(m) == ref.own_match(m)
    places = places_of(rng, ref)
    for p in places:
        assert fast.continuations(p) == ref.continuations(p), p
        assert (fast.occurrences(p), fast.length(p)) == (ref.occurrences(p), ref.length(p))
    text = ref.text
    for _ in range(20):
        if text and rng.random() < 0.6:  # a piece of the text: found as a rule
            j = rng.randrange(len(text))
            pattern = text[max(0, j - rng.randrange(ref.depth + 2)):j + 1]
        else:
            pattern = [rng.randrange(vocab) for _ in range(rng.randrange(ref.depth + 2))]
        assert fast.find(pattern) == ref.find(pattern), pattern
        m = rng.randrange(0, ref.depth + 2)
        query = tokens[-rng.randrange(1, 12):] if tokens and rng.random() < 0.5 else pattern
        assert fast.store_match(query, m) == ref.store_match(query, m), (query, m)
    matches = [ref.own_match(m) for m in (1, 2, 4, ref.depth)] + [ref.store_match(tokens, m) for m in (1, 3)]
    check_grow(rng, ref, fast, places, [q for q in matches if q is not None], vocab)


@pytest.mark.parametrize("depth, max_nodes, vocab", [
    (1, 1 << 30, 3), (2, 1 << 30, 4), (3, 60, 3), (4, 1 << 30, 5), (6, 150, 4), (8, 1 << 30, 6), (12, 200, 3),
    (24, 1 << 30, 8)])
def test_random_streams_equal_the_reference(depth, max_nodes, vocab):
    rng = random.Random(depth * 1000 + vocab)
    full = False
    for _ in range(5):
        ref, fast = SuffixTrie(depth, max_nodes), CSuffixTrie(depth, max_nodes)
        seen: list[int] = []
        for _ in range(rng.randrange(8, 20)):
            if rng.random() < 0.2:
                ref.new_stream()
                fast.new_stream()
                seen = []
            # a repeat of what came before (long matches), or fresh tokens
            if seen and rng.random() < 0.4:
                j = rng.randrange(len(seen))
                tokens = seen[j:j + rng.randrange(1, 12)]
            else:
                tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
            ref.extend(tokens)
            fast.extend(tokens)
            seen += tokens
            full |= ref.size >= max_nodes
            check_equal(rng, ref, fast, vocab, seen)
    assert full == (max_nodes < 1 << 30)  # the bound bites where it is small


def test_a_store_of_many_streams_takes_no_more_past_its_bound():
    rng = random.Random(7)
    ref, fast = SuffixTrie(6, 3000), CSuffixTrie(6, 3000)
    for _ in range(200):
        tokens = [rng.randrange(20) for _ in range(rng.randrange(1, 40))]
        for t in (ref, fast):  # SuffixStore.add
            t.new_stream()
            t.extend(tokens)
            t.new_stream()
        assert (fast.size, len(fast), len(fast.text)) == (ref.size, len(ref), len(ref.text))
    assert ref.size >= 3000 and fast.text == ref.text and fast.active == ref.active
    for n in range(len(ref)):
        assert fast.continuations(n) == ref.continuations(n)
    query = [rng.randrange(20) for _ in range(30)]
    assert fast.store_match(query, 5) == ref.store_match(query, 5)


def test_a_full_tree_buffer_is_an_error():
    t = CSuffixTrie(depth=12)
    t.extend([1, 2, 3] * 10)
    buf = TreeBuf(4)  # the chain "1 2 3 1 ..." after "3" needs 8 nodes and the root
    LIB.tree_reset(buf.ref, 3)
    with pytest.raises(RuntimeError, match="full"):
        t.grow(buf, t.own_match(1), 8, None, 0.0, SUFFIX)


def test_a_place_of_no_trie_is_an_error():
    t = CSuffixTrie(depth=4)
    t.extend([1, 2, 1])
    buf = TreeBuf(8)
    LIB.tree_reset(buf.ref, 1)
    for bad in (7, -2, (-3, 1), (3, 1)):  # beyond the nodes; not a place; ends outside the text
        with pytest.raises(IndexError):
            t.continuations(bad)
        with pytest.raises(IndexError):
            t.grow(buf, bad, 3, 8, 0.0, SUFFIX)
    with pytest.raises(IndexError):
        t.occurrences(7)
