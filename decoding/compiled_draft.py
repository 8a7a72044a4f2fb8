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
SOURCES = [CPU / "tree.c"]
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
