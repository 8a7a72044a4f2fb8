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
from pathlib import Path

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

    def step_tree(self) -> StepTree:
        """The tree built so far, as a ``StepTree`` (children dicts in creation order)."""
        n = self.args.n
        tokens, parents = self.tokens[:n].tolist(), self.parents[:n].tolist()
        candidate = [c == 1 for c in self.candidate[:n]]
        children: list[dict[int, int]] = [{} for _ in range(n)]
        for node in range(1, n):
            if candidate[node]:
                children[parents[node]][tokens[node]] = node
        return StepTree(tokens=tokens, parents=parents, depths=self.depths[:n].tolist(),
                        sources=self.sources[:n].tolist(), candidate=candidate, children=children,
                        group=self.group[:n].tolist())


def check(rc: int, what: str) -> int:
    if rc == TREE_FULL:
        raise RuntimeError(f"{what}: the step tree's buffers are full (sized too small: a bug)")
    return rc
