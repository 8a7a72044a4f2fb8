"""The compiled twin of the built-in proposers' drafting (``decoding/cpu/{tree,suffix,tables}.c``).

What a step of ``pld``, ``suffix``, ``recycle``, ``lookahead``, ``lookahead+pld`` and
``hybrid`` does on the host, besides planning and packing (decoding/compiled.py,
models/packing.py): the prompt-lookup search, the suffix trie and the shared store, the n-gram
pool, the recycled top-k table, the lookahead window, and merging all of it into one step
tree. The per-sequence structures live in C; a proposer's Python composes one call per source
per step into a tree built in C on buffers this module owns, then reads it back as a
``StepTree`` (the contract between the loop and a method is unchanged).

The Python classes (``SuffixTrie``, ``NgramPool``, the recycle table's functions,
``kernels.ngram_match.ngram_match_lists``, ``StepTree.add_*``) stay the readable reference;
tests/test_compiled_draft.py holds each twin equal to it on exact tables and random histories,
and every method's trees and outputs equal on both paths.

Built on first use like the planner (``kernels/cbuild.py``, portable flags); where it cannot
build, the reference runs and one warning says why. The switch is the host path's
(``decoding.compiled.use_compiled`` / ``SPECDEC_HOST=ref``).
"""

import ctypes
from array import array
from dataclasses import fields
from pathlib import Path
from typing import Optional

from decoding.tree import StepTree
from kernels import cbuild

CPU = Path(__file__).with_name("cpu")
SOURCES = [CPU / "tree.c", CPU / "suffix.c"]
HEADERS = [CPU / "tree.h"]
FLAGS = ["-O2", "-std=c11", "-shared", "-fPIC"]

TREE_NONE, TREE_FULL = -1, -2


def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.tree_reset.argtypes = [p, i]
    lib.tree_reset.restype = i
    lib.tree_add_child.argtypes = [p, i, i, i, i]
    lib.tree_add_child.restype = i
    lib.tree_add_chain.argtypes = [p, p, i, i, i, p]
    lib.tree_add_chain.restype = i
    lib.tree_add_private.argtypes = [p, i, p, i, i, i, p]
    lib.tree_add_private.restype = i
    lib.tree_add_window.argtypes = [p, p, i, i, i, p]
    lib.tree_add_window.restype = i
    for declare in _DECLARE:
        declare(lib)


_DECLARE: list = []  # each component's declarations (below), run when the library loads

# the library, built on first use (enabled)
LIBRARY = cbuild.OnDemand("decoding-draft", SOURCES, FLAGS, [], _declare,
                          "the proposers draft with their Python reference", HEADERS)


def enabled() -> bool:
    """The compiled drafting is switched on and built."""
    return cbuild.host_compiled() and LIBRARY.get() is not None


def _ptr(a: array) -> int:
    return a.buffer_info()[0]


class _TreeArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("tokens", "parents", "depths", "sources", "group", "candidate",
                                                "first_child", "next_sibling", "last_child")] + \
        [(n, ctypes.c_int32) for n in ("n", "cap", "n_cand")]


class TreeBuf:
    """The buffers a step tree is built in by C (``Tree`` of tree.h); ``step_tree`` reads it
    back as a ``StepTree``. One per proposer: a tree is read back before the next is built."""

    def __init__(self, cap: int = 256):
        self._alloc(cap)

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        zero = bytes(4 * cap)
        self.tokens, self.parents, self.depths, self.sources, self.group = (array("i", zero) for _ in range(5))
        self.candidate = array("b", bytes(cap))
        self._links = [array("i", zero) for _ in range(3)]
        self.args = _TreeArgs(*(_ptr(a) for a in (self.tokens, self.parents, self.depths, self.sources,
                                                  self.group, self.candidate, *self._links)), 0, cap, 0)
        self.ref = ctypes.byref(self.args)

    def ensure(self, cap: int) -> None:
        """Room for ``cap`` nodes (the tree is lost if the buffers grow)."""
        if cap > self.cap:
            self._alloc(max(cap, 2 * self.cap))

    @property
    def n(self) -> int:
        return self.args.n

    def start(self, root: int, cap: int) -> None:
        """A new tree of the root alone, with room for ``cap`` nodes."""
        if cap > self.cap:
            self._alloc(max(cap, 2 * self.cap))
        LIBRARY.lib.tree_reset(self.ref, root)

    def add_chain(self, chain: list[int], source: int, max_nodes: int) -> None:
        """``StepTree.add_chain`` (a proposer's own chains, e.g. a user's source)."""
        a = array("i", chain)
        check(LIBRARY.lib.tree_add_chain(self.ref, _ptr(a) if chain else None, len(a), source, max_nodes, None),
              "add_chain")

    def add_window(self, levels: list[list[int]], source: int) -> list[int]:
        """The lookahead window (``tree_add_window``): each column's last node."""
        W = len(levels[0])
        flat, tips = array("i"), array("i", bytes(4 * W))
        for lv in levels:
            flat.extend(lv)
        check(LIBRARY.lib.tree_add_window(self.ref, _ptr(flat), len(levels), W, source, _ptr(tips)), "add_window")
        return tips.tolist()

    def step_tree(self) -> "BuiltTree":
        """The tree built so far, as a ``StepTree``."""
        n = self.args.n
        return BuiltTree(self.tokens[:n].tolist(), self.parents[:n].tolist(), self.depths[:n].tolist(),
                         self.sources[:n].tolist(), [c == 1 for c in self.candidate[:n]], self.group[:n].tolist())


class BuiltTree(StepTree):
    """A ``StepTree`` read back from C, whose ``children`` dicts are made on first use: with a
    planner most proposed trees are only read through their flat lists (the planner's C, the
    subtree it sends), and the dicts of a 60-node tree cost as much as reading the rest."""

    def __init__(self, tokens: list[int], parents: list[int], depths: list[int], sources: list[int],
                 candidate: list[bool], group: list[int]):
        self.tokens, self.parents, self.depths, self.sources = tokens, parents, depths, sources
        self.candidate, self.group = candidate, group
        self.extra_logits: set[int] = set()
        self.chance: dict[int, float] = {}
        self.pinned: set[int] = set()
        self._children: Optional[list[dict[int, int]]] = None

    @property
    def children(self) -> list[dict[int, int]]:
        if self._children is None:
            tokens, parents, candidate = self.tokens, self.parents, self.candidate
            kids: list[dict[int, int]] = [{} for _ in tokens]
            for node in range(1, len(tokens)):
                if candidate[node]:
                    kids[parents[node]][tokens[node]] = node
            self._children = kids
        return self._children

    def __eq__(self, other) -> bool:  # equal to the StepTree of the same fields
        if not isinstance(other, StepTree):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(StepTree))


def check(rc: int, what: str) -> int:
    if rc == TREE_FULL:
        raise RuntimeError(f"{what}: the step tree's buffers are full (sized too small: a bug)")
    return rc


# ---- the suffix trie
SUFFIX_NOMEM, SUFFIX_BAD_PLACE = -3, -4  # suffix.c: an allocation failed; a place not of the trie


def _declare_suffix(lib: ctypes.CDLL) -> None:
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.suffix_new.argtypes = [i, i64]
    lib.suffix_new.restype = p
    lib.suffix_free.argtypes = [p]
    lib.suffix_free.restype = None
    for name in ("suffix_n_nodes", "suffix_text_len", "suffix_n_active"):
        getattr(lib, name).argtypes = [p]
        getattr(lib, name).restype = i
    lib.suffix_size.argtypes = [p]
    lib.suffix_size.restype = i64
    for name in ("suffix_text", "suffix_active"):
        getattr(lib, name).argtypes = [p]
        getattr(lib, name).restype = p
    for name in ("suffix_count", "suffix_level", "suffix_own_match"):
        getattr(lib, name).argtypes = [p, i]
        getattr(lib, name).restype = i
    lib.suffix_extend.argtypes = [p, p, i]
    lib.suffix_extend.restype = i
    lib.suffix_new_stream.argtypes = [p]
    lib.suffix_new_stream.restype = i
    lib.suffix_find.argtypes = [p, p, i, p]
    lib.suffix_find.restype = i
    lib.suffix_store_match.argtypes = [p, p, i, i, p]
    lib.suffix_store_match.restype = i
    lib.suffix_continuations.argtypes = [p, i, i, i, p, i]
    lib.suffix_continuations.restype = i
    lib.suffix_grow.argtypes = [p, p, i, i, i, i, i, ctypes.c_double, i]
    lib.suffix_grow.restype = i


_DECLARE.append(_declare_suffix)


def _suffix_rc(rc: int, what: str) -> int:
    if rc == SUFFIX_NOMEM:
        raise MemoryError(f"{what}: the suffix trie could not grow its arrays")
    if rc == SUFFIX_BAD_PLACE:
        raise IndexError(f"{what}: not a place of this suffix trie")
    return rc


class CSuffixTrie:
    """``decoding.suffix.SuffixTrie`` in C (decoding/cpu/suffix.c), the same API: places are
    the same Python values (a node id, or ``(end, length)`` of a substring seen once), and
    ``grow`` is ``grow_tree`` into a ``TreeBuf``. ``text`` and ``active`` are copies (for
    inspection and tests); the reference's ``child`` / ``count`` / ``last`` / ``level`` lists
    are not kept (``occurrences`` / ``length`` read them). One thread at a time: ctypes calls
    run without the GIL and a trie keeps its scratch buffers (grow's heap, continuations)."""

    def __init__(self, depth: int, max_nodes: int = 1 << 30):
        lib = LIBRARY.get()
        if lib is None:
            raise RuntimeError(f"the compiled drafting did not build: {LIBRARY.reason}")
        self.depth, self.max_nodes = depth, max_nodes
        self._lib = lib
        self._t = lib.suffix_new(depth, max_nodes)
        if not self._t:
            raise MemoryError("suffix_new: out of memory")
        self._place = array("i", bytes(12))  # find / store_match write (node, end, len) here
        self._place_ptr = _ptr(self._place)
        self._cont = array("i", bytes(4 * 5 * 64))  # continuations: 5 ints each
        # the calls, bound once (a step makes a few per sequence)
        self._extend, self._find, self._store_match = lib.suffix_extend, lib.suffix_find, lib.suffix_store_match
        self._own_match, self._conts, self._grow = lib.suffix_own_match, lib.suffix_continuations, lib.suffix_grow

    def __del__(self):
        t, self._t = getattr(self, "_t", None), None
        if t:
            self._lib.suffix_free(t)

    def __len__(self) -> int:
        return self._lib.suffix_n_nodes(self._t)

    @property
    def size(self) -> int:
        return self._lib.suffix_size(self._t)

    @property
    def text(self) -> list[int]:
        n = self._lib.suffix_text_len(self._t)
        return list((ctypes.c_int32 * n).from_address(self._lib.suffix_text(self._t))) if n else []

    @property
    def active(self) -> list[int]:
        n = self._lib.suffix_n_active(self._t)
        return list((ctypes.c_int32 * n).from_address(self._lib.suffix_active(self._t)))

    def extend(self, tokens) -> None:
        if len(tokens):
            buf = array("i", tokens)
            _suffix_rc(self._extend(self._t, buf.buffer_info()[0], len(buf)), "extend")

    def new_stream(self) -> None:
        _suffix_rc(self._lib.suffix_new_stream(self._t), "new_stream")

    def occurrences(self, place) -> int:
        if place is None:
            return 0
        return _suffix_rc(self._lib.suffix_count(self._t, place), "occurrences") if isinstance(place, int) else 1

    def length(self, place) -> int:
        return _suffix_rc(self._lib.suffix_level(self._t, place), "length") if isinstance(place, int) else place[1]

    def _read_place(self):
        node, end, n = self._place
        return node if node >= 0 else (end, n)

    def continuations(self, place) -> list:
        node, end, n = (place, 0, 0) if isinstance(place, int) else (-1, *place)
        cont = self._cont
        k = _suffix_rc(self._conts(self._t, node, end, n, _ptr(cont), len(cont) // 5), "continuations")
        if k > len(cont) // 5:
            cont = self._cont = array("i", bytes(4 * 5 * 2 * k))
            k = _suffix_rc(self._conts(self._t, node, end, n, _ptr(cont), len(cont) // 5), "continuations")
        flat = cont[:5 * k].tolist()
        return [(flat[i], flat[i + 1] if flat[i + 1] >= 0 else (flat[i + 2], flat[i + 3]), flat[i + 4])
                for i in range(0, 5 * k, 5)]

    def find(self, pattern):
        buf = array("i", pattern)
        return self._read_place() if self._find(self._t, buf.buffer_info()[0], len(buf), self._place_ptr) else None

    def own_match(self, max_match: int):
        node = self._own_match(self._t, max_match)
        return node if node >= 0 else None

    def store_match(self, text, max_match: int):
        if max_match < 1:
            return None
        buf = array("i", text[-max_match:])  # only suffixes of at most max_match tokens count
        found = self._store_match(self._t, buf.buffer_info()[0], len(buf), max_match, self._place_ptr)
        return self._read_place() if found else None

    def grow(self, tree_buf: TreeBuf, place, max_depth: int, max_nodes, min_prob: float, source: int) -> None:
        """``grow_tree`` from ``place`` into the tree being built in ``tree_buf`` (max_nodes None:
        no limit)."""
        node, end, n = (place, 0, 0) if isinstance(place, int) else (-1, *place)
        cap = -1 if max_nodes is None else max(max_nodes, 0)  # a negative limit creates nothing, as in Python
        rc = self._grow(self._t, tree_buf.ref, node, end, n, max_depth, cap, min_prob, source)
        if rc < 0:
            check(_suffix_rc(rc, "grow"), "grow")
