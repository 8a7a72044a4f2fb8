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
from collections.abc import Sequence
from dataclasses import fields
from itertools import chain
from pathlib import Path
from typing import Optional

from decoding import compiled, inputs
from decoding.tree import HARVEST, PLD, POOL, RECYCLE, SUFFIX, WINDOW, StepTree
from kernels import cbuild

CPU = Path(__file__).with_name("cpu")
SOURCES = [CPU / "tree.c", CPU / "suffix.c", CPU / "tables.c", CPU / "draft.c"]
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
    lib.draft_lookahead.argtypes = [p, p, i, i, i, i, p, i, i, p, p]
    lib.draft_lookahead.restype = i
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


def tail_start(tokens, start) -> int:
    """``start`` of ``extend_from(tokens, start)`` checked: the tokens already fed, 0 to len(tokens)."""
    return inputs.integer(start, "start", f"an integer in [0, {len(tokens)}] (the tokens already fed)",
                          lambda v: 0 <= v <= len(tokens))


_ADDRESSES: dict[str, int] = {}


def _address(name: str) -> int:
    """The address of the library's function ``name``, for the C glue (decoding/cpu/glue.c)."""
    at = _ADDRESSES.get(name)
    if at is None:
        at = _ADDRESSES[name] = ctypes.cast(getattr(LIBRARY.lib, name), ctypes.c_void_p).value
    return at


class _TreeArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("tokens", "parents", "depths", "sources", "group", "candidate",
                                                "first_child", "next_sibling", "last_child")] + \
        [(n, ctypes.c_int32) for n in ("n", "cap", "n_cand")]


class TreeBuf:
    """The buffers a step tree is built in by C (``Tree`` of tree.h); ``step_tree`` reads it
    back as a ``StepTree``. One per proposer: a tree is read back before the next is built."""

    def __init__(self, cap: int = 256):
        self._alloc(cap)
        # the C glue (None: ctypes), chosen when the object is made as the planner's is: a step's
        # calls cost microseconds each when the forward left the caches cold (decoding/compiled.py)
        self._glue, self._draft_at = compiled.glue(), _address("draft_lookahead") if LIBRARY.get() else 0

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        zero = bytes(4 * cap)
        self.tokens, self.parents, self.depths, self.sources, self.group = (array("i", zero) for _ in range(5))
        self.candidate = array("b", bytes(cap))
        self._links = [array("i", zero) for _ in range(3)]
        self.args = _TreeArgs(*(_ptr(a) for a in (self.tokens, self.parents, self.depths, self.sources,
                                                  self.group, self.candidate, *self._links)), 0, cap, 0)
        self.ref = ctypes.byref(self.args)
        self.at = ctypes.addressof(self.args)  # for the C glue

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

    def draft(self, sources: "DraftSources", root: int, max_depth: int, cap: int, max_nodes: int,
              levels: Optional[list[list[int]]]) -> Optional[list[int]]:
        """One sequence's whole tree of a lookahead-family proposer in one call (draft.c's
        ``draft_lookahead``): the tree of ``root`` with the parts ``sources`` holds, the window of
        ``levels`` (None: none); returns the window's tips (None without a window). ``cap`` caps
        the suffix, prompt-lookup and pool parts, ``max_nodes`` the recycled tree; the buffers
        must hold the tree (``ensure``)."""
        glue = self._glue
        done = None if glue is None else glue.draft(self._draft_at, self.at, sources.at,
                                                    root, max_depth, cap, max_nodes, levels)
        if done is None:
            flat = tips = None
            L = W = 0
            if levels is not None:
                L, W = len(levels), len(levels[0])
                flat, tips = array("i", chain.from_iterable(levels)), array("i", bytes(4 * W))
            stage = ctypes.c_int()
            rc = LIBRARY.lib.draft_lookahead(self.ref, ctypes.byref(sources), root, max_depth, cap, max_nodes,
                                             None if flat is None else _ptr(flat), L, W,
                                             None if tips is None else _ptr(tips), ctypes.byref(stage))
            done = rc, stage.value, None if tips is None else tips.tolist()
        rc, stage, tips = done
        if rc < 0:
            what = _DRAFT_STAGES.get(stage, "draft_lookahead")
            check(_suffix_rc(rc, what) if stage == 1 else _ok(rc, what), what)
        return tips

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
        flat = (self.parents[:n], self.depths[:n], self.sources[:n], self.group[:n], self.candidate[:n])
        tree = BuiltTree(self.tokens[:n].tolist(), flat[0].tolist(), flat[1].tolist(), flat[2].tolist(),
                         list(map(bool, flat[4])), flat[3].tolist(), self._links[0][:n], self._links[1][:n])
        tree.flat = flat
        return tree


# draft.c's parts, by the stage it names where one fails
_DRAFT_STAGES = {1: "CSuffixTrie.grow", 2: "CHistory.add_to_tree", 3: "CNgramPool.add_chains", 4: "add_window",
                 5: "CTable.grow"}


class DraftSources(ctypes.Structure):
    """A sequence's sources for ``TreeBuf.draft`` (draft.c's ``DraftSources``, the same layout):
    the handles of its C objects (own suffix trie, prompt-lookup history, n-gram pool, recycled
    table; None: not in the method) and their parameters. ``keep`` holds the objects whose
    handles it holds (and the widths' array), so that none is freed while it is in use."""

    _fields_ = [("own", ctypes.c_void_p), ("own_min_prob", ctypes.c_double), ("own_max_match", ctypes.c_int32),
                ("hist", ctypes.c_void_p)] + \
        [(n, ctypes.c_int32) for n in ("min_n", "max_n", "k", "num_candidates", "recent", "partial")] + \
        [("pool", ctypes.c_void_p), ("guesses", ctypes.c_int32), ("table", ctypes.c_void_p),
         ("widths", ctypes.c_void_p), ("n_widths", ctypes.c_int32)] + \
        [(n, ctypes.c_int32) for n in ("suffix_source", "pld_source", "window_source", "recycle_source")]

    def set_pool(self, pool: "CNgramPool", guesses: int) -> None:
        self.pool, self.guesses = pool._h, guesses
        self.keep["pool"] = pool

    def set_history(self, hist: "CHistory", min_n: int, max_n: int, k: int, num_candidates: int = 1,
                    prefer: str = "first", partial: bool = True) -> None:
        """Prompt lookup's part: ``CHistory.add_to_tree``'s search arguments."""
        recent = _PREFER.get(prefer)
        if recent is None:
            raise ValueError(f"prefer must be 'first' or 'recent', got {prefer!r}")
        self.hist, self.min_n, self.max_n, self.k, self.num_candidates = hist._h, min_n, max_n, k, num_candidates
        self.recent, self.partial = recent, bool(partial)
        self.keep["hist"] = hist

    def set_own(self, trie: "CSuffixTrie", max_match: int, min_prob: float) -> None:
        """The sequence's own suffix continuations: ``own_match(max_match)``, grown with ``min_prob``."""
        self.own, self.own_max_match, self.own_min_prob = trie._t, max_match, min_prob
        self.keep["own"] = trie

    def set_table(self, table: "CTable", widths: array) -> None:
        """The recycled tree: ``CTable.grow(widths)`` (an int32 array, held)."""
        self.table, self.widths, self.n_widths = table._h, _ptr(widths), len(widths)
        self.keep["table"], self.keep["widths"] = table, widths


def draft_sources() -> DraftSources:
    """Sources of no part yet (the pool is set before a tree is drafted), with the source bits
    of decoding/tree.py."""
    s = DraftSources()
    s.keep, s.at = {}, ctypes.addressof(s)  # its address, for the C glue
    s.suffix_source, s.pld_source, s.window_source, s.recycle_source = SUFFIX, PLD, WINDOW, RECYCLE
    return s


class NodeChildren(Sequence):
    """``StepTree.children`` of a tree read back from C: node i's dict made when it is first
    asked for, from the C tree's child lists (creation order, as the dicts'). Verification
    reads the few nodes of the accepted path; a planner's C reads none."""

    def __init__(self, tokens: list[int], first: array, after: array):
        self._tokens, self._first, self._after = tokens, first, after
        self._made: dict[int, dict[int, int]] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        n = len(self._tokens)  # not len(self): a call of its own (decode_step)
        if i < 0:
            i += n
        kids = self._made.get(i)
        if kids is None:
            if not 0 <= i < n:
                raise IndexError("node index out of range")
            kids, c, tokens, after = {}, self._first[i], self._tokens, self._after
            while c >= 0:
                kids[tokens[c]] = c
                c = after[c]
            self._made[i] = kids
        return kids

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, Sequence)) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


class BuiltTree(StepTree):
    """A ``StepTree`` read back from C, whose ``children`` dicts are made on first use
    (``NodeChildren``): most proposed trees are only read through their flat lists (the
    planner's C, the subtree it sends), and the dicts of a 60-node tree cost as much as reading
    the rest. ``flat`` keeps the C tree's arrays (parents, depths, sources, group, candidate),
    which the planner's C reads as they are (decoding/compiled.py). Grow it through its methods
    (``add_chain`` ...): they make the dicts and drop ``flat`` first."""

    def __init__(self, tokens: list[int], parents: list[int], depths: list[int], sources: list[int],
                 candidate: list[bool], group: list[int], first: array, after: array):
        self.tokens, self.parents, self.depths, self.sources = tokens, parents, depths, sources
        self.candidate, self.group = candidate, group
        self.extra_logits: set[int] = set()
        self.chance: dict[int, float] = {}
        self.pinned: set[int] = set()
        # an attribute, not a property: verification reads it every step (a property is a call)
        self.children = NodeChildren(tokens, first, after)
        self.flat: Optional[tuple[array, ...]] = None

    def _new(self, parent: int, token: int, source: int, candidate: bool, group: int = -1) -> int:
        if isinstance(self.children, NodeChildren):  # a list of dicts from now on
            self.children = [dict(kids) for kids in self.children]
        self.flat = None
        return super()._new(parent, token, source, candidate, group)

    def add_child(self, parent: int, token: int, source: int, max_nodes: Optional[int] = None) -> Optional[int]:
        self.flat = None  # a merge changes a node's sources
        return super().add_child(parent, token, source, max_nodes)

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
        self._glue, self._extend_at = compiled.glue(), _address("suffix_extend")  # as TreeBuf's

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
        self.extend_from(tokens, 0)

    def extend_from(self, tokens, start: int) -> None:
        """``extend(tokens[start:])``, a list's tail read where it is by the C glue (a step's few
        new tokens), else copied into an array for the call."""
        glue = self._glue
        rc = None if glue is None else glue.append_tail(self._extend_at, self._t, tokens, start)
        if rc is None:
            tail = tokens[tail_start(tokens, start):]
            if not len(tail):
                return
            buf = array("i", tail)
            rc = self._extend(self._t, buf.buffer_info()[0], len(buf))
        if rc < 0:  # the check only on a failure: a call is a step's cost (decoding/compiled.py)
            _suffix_rc(rc, "extend")

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


# ---- n-gram pool, recycled table, prompt-lookup history ------------------------------------
# decoding/cpu/tables.c. Each class holds one C object (freed in __del__) and keeps its C
# functions as attributes, so that a call is one ctypes call on int pointers. Token lists are
# passed as array('i') (built here from any sequence of ints); where C refuses the arguments
# (TAB_BADARG) a ValueError says so, and an allocation it could not make is a MemoryError.
TAB_NOMEM, TAB_BADARG = -3, -4
_PREFER = {"first": 0, "recent": 1}


def _declare_tables(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int
    for name, args, res in (
            ("pool_create", [i, i], p), ("pool_free", [p], None), ("pool_total", [p], ctypes.c_int64),
            ("pool_add", [p, p, i, i], i), ("pool_add_all", [p, p, i, i], i), ("pool_count", [p, i], i),
            ("pool_add_many", [p, p, i, i], i),
            ("pool_items", [p, i, p, p], i), ("pool_add_chains", [p, p, i, i, i, i], i),
            ("table_create", [i], p), ("table_free", [p], None), ("table_len", [p], i), ("table_top_k", [p], i),
            ("table_seed", [p, p, i], i), ("table_merge_into", [p, p], i), ("table_refresh", [p, p, p, i, i], i),
            ("table_get", [p, i, p], i), ("table_entry", [p, i, p, p], i),
            ("table_grow", [p, p, p, i, i, i, i], i),
            ("hist_create", [], p), ("hist_free", [p], None), ("hist_len", [p], i), ("hist_append", [p, p, i], i),
            ("hist_truncate", [p, i], i), ("hist_search", [p, i, i, i, i, i, i, p, p], i),
            ("hist_add_to_tree", [p, p] + [i] * 9, i)):
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res


_DECLARE.append(_declare_tables)


def _lib() -> ctypes.CDLL:
    lib = LIBRARY.get()
    if lib is None:
        raise RuntimeError(f"the compiled drafting is not built: {LIBRARY.reason}")
    return lib


def _ok(rc: int, what: str) -> int:
    """rc, unless it is one of tables.c's or tree.h's errors."""
    if rc < 0:
        if rc == TAB_NOMEM:
            raise MemoryError(f"{what}: out of memory")
        if rc == TAB_BADARG:
            raise ValueError(f"{what}: invalid arguments")
        check(rc, what)
    return rc


# max_nodes below, StepTree's as tree.h's, written inline (a helper would add a Python call): None is no limit (-1
# there); a negative limit admits no new node in StepTree.add_child (num_candidates >=
# max_nodes), as 0 does: max(max_nodes, 0).


class CNgramPool:
    """NgramPool (decoding/ngram_pool.py) in C: the same API, the same contents and order;
    ``add_chains`` merges the pool's n-grams after ``key`` into a step tree as
    Lookahead.propose does."""

    def __init__(self, n: int, capacity: int):
        lib = _lib()
        self.n, self.capacity = n, capacity
        # a negative capacity keeps nothing in the reference (every n-gram added is popped): 0 here
        self._h = lib.pool_create(n, max(capacity, 0))
        if not self._h:
            raise ValueError(f"CNgramPool(n={n}, capacity={capacity}): n must be >= 1 (or out of memory)")
        self._free = lib.pool_free
        self._add, self._add_all, self._count = lib.pool_add, lib.pool_add_all, lib.pool_count
        self._add_many = lib.pool_add_many
        self._items, self._chains, self._total = lib.pool_items, lib.pool_add_chains, lib.pool_total
        self._at = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (lib.pool_add_all, lib.pool_add_many))
        self._glue = compiled.glue()  # as TreeBuf's

    def __del__(self):
        if getattr(self, "_h", None):
            self._free(self._h)
            self._h = None

    def add(self, ngram, origin: int = POOL) -> None:
        a = array("i", ngram)
        _ok(self._add(self._h, _ptr(a), len(a), origin), "CNgramPool.add")

    def add_many(self, ngrams, origin: int = POOL) -> None:
        """NgramPool.add_many: one C call."""
        ngrams = [g for g in ngrams if len(g) == self.n]
        if ngrams:
            a = array("i", chain.from_iterable(ngrams))
            _ok(self._add_many(self._h, _ptr(a), len(ngrams), origin), "CNgramPool.add_many")

    def add_all(self, tokens, start: int = 0) -> None:
        """NgramPool.add_all; only the tokens the new n-grams hold cross to C."""
        lo = max(0, start - self.n + 1)
        a = array("i", tokens[lo:])
        _ok(self._add_all(self._h, _ptr(a), len(a), start - lo), "CNgramPool.add_all")

    def window_update(self, tokens: list[int], n_new: int, levels: list[list[int]], real: list[list[bool]],
                      tips: Optional[list[int]], rows: dict[int, int], top1: list[int], root: int,
                      from_output: bool) -> Optional[tuple[list[list[int]], list[list[bool]]]]:
        """Lookahead.update's pool and window work in one call of the C glue (decoding/cpu/glue.c,
        the window sliding one level): with ``from_output`` the n-grams holding the last
        ``n_new`` tokens, then (``tips`` not None) the window's closed columns (``harvest``, each
        tip's prediction ``top1[rows[tip]]``) with origin HARVEST; returns the slid window
        (levels, real), or None where the glue is not built or does not take the call (the pool
        unchanged: the caller runs the Python glue)."""
        glue = self._glue
        if glue is None:
            return None
        done = glue.window_update(self._at[0], self._at[1], self._h, self.n, tokens, n_new, levels, real, tips, rows,
                                  top1, root, HARVEST, from_output)
        if done is None:
            return None
        if done[0] < 0:
            _ok(done[0], "CNgramPool.window_update")
        return done[1], done[2]

    def items(self, key: int) -> list[tuple[tuple, int]]:
        count = self._count(self._h, key)
        if count == 0:
            return []
        m = self.n - 1
        rest, origin = array("i", bytes(4 * max(1, count * m))), array("i", bytes(4 * count))
        self._items(self._h, key, _ptr(rest), _ptr(origin))
        return [(tuple(rest[c * m:(c + 1) * m]), origin[c]) for c in range(count)]

    def get(self, key: int) -> list[tuple]:
        return [rest for rest, _ in self.items(key)]

    def __len__(self) -> int:
        return self._total(self._h)

    def add_chains(self, tree_buf: TreeBuf, key: int, guesses: int, max_depth: int, max_nodes: int | None) -> int:
        """``for ngram, origin in pool.items(key)[:guesses]: tree.add_chain(list(ngram[:max_depth]),
        origin, max_nodes)`` on the tree in ``tree_buf``; returns the chains merged."""
        rc = self._chains(self._h, tree_buf.ref, key, guesses, max_depth,
                          -1 if max_nodes is None else max(max_nodes, 0))
        return rc if rc >= 0 else _ok(rc, "CNgramPool.add_chains")


class CTable:
    """The token-recycling table (decoding/recycle.py's ``Table``: token -> its top-k next
    tokens, best first) in C, rows of at most ``top_k`` tokens. ``seed`` is
    ``seed_table(tokens, top_k, self)``; ``merge_into(other)`` is
    ``for tok, row in self.items(): other.setdefault(tok, row)`` (Recycle.init_state seeds a
    fresh table from the prompt and merges it into the sequence's or the shared one);
    ``refresh`` is ``refresh``; ``grow`` is ``grow_tree``. ``items()`` is in the order the
    reference's dict has (tokens in the order they first entered)."""

    def __init__(self, top_k: int):
        lib = _lib()
        self._h = lib.table_create(top_k)
        if not self._h:
            raise ValueError(f"CTable(top_k={top_k}): top_k must be >= 1 (or out of memory)")
        self.top_k = top_k
        self._row = array("i", bytes(4 * top_k))
        self._token = ctypes.c_int32()
        self._free = lib.table_free
        self._seed, self._merge, self._refresh = lib.table_seed, lib.table_merge_into, lib.table_refresh
        self._refresh_at = ctypes.cast(lib.table_refresh, ctypes.c_void_p).value  # for the C glue
        self._glue = compiled.glue()  # as TreeBuf's
        self._get, self._entry, self._len, self._grow = lib.table_get, lib.table_entry, lib.table_len, lib.table_grow

    def __del__(self):
        if getattr(self, "_h", None):
            self._free(self._h)
            self._h = None

    def seed(self, tokens) -> None:
        a = array("i", tokens)
        _ok(self._seed(self._h, _ptr(a), len(a)), "CTable.seed")

    def merge_into(self, other: "CTable") -> int:
        """Rows of this table for tokens ``other`` has none for, copied into ``other`` (in this
        table's order); returns how many."""
        return _ok(self._merge(self._h, other._h), "CTable.merge_into (a row longer than the other's top_k?)")

    def refresh(self, tokens, rows) -> None:
        """``table[tok] = row`` for tok, row in zip(tokens, rows); the rows of one call have one
        length (<= top_k), as Outcome.top_rows gives them."""
        n = min(len(tokens), len(rows))
        if n == 0:
            return
        k = len(rows[0])
        flat = array("i", chain.from_iterable(rows[:n]))
        if len(flat) != n * k:
            raise ValueError(f"CTable.refresh: rows of one call have one length, got {sorted(set(map(len, rows)))}")
        self.refresh_flat(array("i", tokens[:n]), flat, k)

    def learn(self, tokens: list[int], rows: dict[int, int], path: list[int], top: list[list[int]]) -> bool:
        """recycle.learn_from's refresh in one call of the C glue (decoding/cpu/glue.c): the rows'
        nodes in increasing order, those off ``path`` first, ``table[tokens[n]] = top[rows[n]]``;
        False where the glue is not built or does not take it (the caller then refreshes)."""
        glue = self._glue
        if glue is None:
            return False
        rc = glue.learn(self._refresh_at, self._h, tokens, rows, path, top)
        if rc is None:
            return False
        if rc < 0:
            _ok(rc, "CTable.refresh")
        return True

    def __setitem__(self, tok: int, row) -> None:
        self.refresh([tok], [row])

    def update(self, rows: dict) -> None:
        """``dict.update``: the rows of ``rows`` (any lengths up to top_k), in its order."""
        for tok, row in rows.items():
            self[tok] = row

    def refresh_flat(self, tokens: array, rows_flat: array, k: int) -> None:
        """``refresh`` with the rows back to back in one array (k tokens each)."""
        if len(rows_flat) < len(tokens) * k:
            raise ValueError(f"CTable.refresh_flat: {len(rows_flat)} tokens for {len(tokens)} rows of {k}")
        _ok(self._refresh(self._h, _ptr(tokens), _ptr(rows_flat), len(tokens), k), "CTable.refresh")

    def refresh_at(self, tokens_addr: int, rows_addr: int, n: int, k: int) -> None:
        """``refresh`` from memory the caller holds alive: n int32 tokens at ``tokens_addr`` and
        n rows of k int32 tokens back to back at ``rows_addr`` (e.g. contiguous int32 CPU
        tensors' ``data_ptr()``): the model's top-k rows need not become Python lists, which
        costs more than the reference's refresh (it stores the lists it is given)."""
        _ok(self._refresh(self._h, tokens_addr, rows_addr, n, k), "CTable.refresh")

    def get(self, tok: int, default=None):
        n = self._get(self._h, tok, _ptr(self._row))
        return default if n < 0 else self._row[:n].tolist()

    def __getitem__(self, tok: int) -> list[int]:
        n = self._get(self._h, tok, _ptr(self._row))
        if n < 0:
            raise KeyError(tok)
        return self._row[:n].tolist()

    def __contains__(self, tok: int) -> bool:
        return self._get(self._h, tok, _ptr(self._row)) >= 0

    def __len__(self) -> int:
        return self._len(self._h)

    def items(self) -> list[tuple[int, list[int]]]:
        out = []
        for e in range(self._len(self._h)):
            n = self._entry(self._h, e, ctypes.byref(self._token), _ptr(self._row))
            out.append((self._token.value, self._row[:n].tolist()))
        return out

    def grow(self, tree_buf: TreeBuf, widths, max_depth: int, max_nodes: int | None, source: int = RECYCLE) -> None:
        """recycle.grow_tree(tree, self, widths, max_depth, max_nodes, source) on the tree in
        ``tree_buf``."""
        w = array("i", widths)
        rc = self._grow(self._h, tree_buf.ref, w.buffer_info()[0], len(w), max_depth,
                        -1 if max_nodes is None else max(max_nodes, 0), source)
        if rc < 0:
            _ok(rc, "CTable.grow")


class CHistory:
    """A sequence's tokens in C, appended to as it grows, and prompt lookup's search over them:
    ``search`` is ``ngram_match_lists([tokens], ...)[0]``; ``add_to_tree`` merges what it finds
    into a step tree (``tree.add_chain(chain[:max_depth], source, max_nodes)`` per chain, in
    order)."""

    def __init__(self, tokens=()):
        lib = _lib()
        self._h = lib.hist_create()
        if not self._h:
            raise MemoryError("CHistory: out of memory")
        self._free, self._append, self._truncate, self._len = lib.hist_free, lib.hist_append, lib.hist_truncate, \
            lib.hist_len
        self._search, self._add = lib.hist_search, lib.hist_add_to_tree
        self._glue, self._append_at = compiled.glue(), _address("hist_append")  # as TreeBuf's
        self._out: dict[tuple[int, int], tuple] = {}  # (num_candidates, k) -> search's buffers, their pointers
        if len(tokens):
            self.extend(tokens)

    def __del__(self):
        if getattr(self, "_h", None):
            self._free(self._h)
            self._h = None

    def __len__(self) -> int:
        return self._len(self._h)

    def extend(self, tokens) -> None:
        self.extend_from(tokens, 0)

    def extend_from(self, tokens, start: int) -> None:
        """``extend(tokens[start:])``, a list's tail read where it is by the C glue (a step's few
        new tokens), else copied into an array for the call."""
        glue = self._glue
        rc = None if glue is None else glue.append_tail(self._append_at, self._h, tokens, start)
        if rc is None:
            a = array("i", tokens[tail_start(tokens, start):])
            rc = self._append(self._h, _ptr(a), len(a))
        if rc < 0:
            _ok(rc, "CHistory.extend")

    def sync(self, tokens) -> None:
        """Append what ``tokens`` holds beyond this history (which is its prefix)."""
        n = self._len(self._h)
        if len(tokens) > n:
            self.extend(tokens[n:])

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens."""
        _ok(self._truncate(self._h, n), f"CHistory.truncate({n}) of {len(self)}")

    def _fail(self, rc: int, what: str, min_n, max_n, k, num_candidates) -> None:
        _ok(rc, f"CHistory.{what}(min_n={min_n}, max_n={max_n}, k={k}, num_candidates={num_candidates})")

    def search(self, *, min_n: int, max_n: int, k: int, num_candidates: int = 1, prefer: str = "first",
               partial: bool = True) -> list[list[int]]:
        bufs = self._out.get((num_candidates, k))
        if bufs is None:
            if num_candidates < 1 or k < 1:
                raise ValueError(f"CHistory.search: k={k}, num_candidates={num_candidates} must be >= 1")
            toks, lens = array("i", bytes(4 * num_candidates * k)), array("i", bytes(4 * num_candidates))
            bufs = self._out[num_candidates, k] = (toks, lens, _ptr(toks), _ptr(lens))
        recent = _PREFER.get(prefer)
        if recent is None:
            raise ValueError(f"prefer must be 'first' or 'recent', got {prefer!r}")
        toks, lens, toks_p, lens_p = bufs
        found = self._search(self._h, min_n, max_n, k, num_candidates, recent, partial, toks_p, lens_p)
        if found < 0:
            self._fail(found, "search", min_n, max_n, k, num_candidates)
        return [toks[c * k:c * k + lens[c]].tolist() for c in range(found)]

    def add_to_tree(self, tree_buf: TreeBuf, *, min_n: int, max_n: int, k: int, num_candidates: int = 1,
                    prefer: str = "first", partial: bool = True, max_depth: int, max_nodes: int | None,
                    source: int = PLD) -> int:
        """The search's chains merged into the tree in ``tree_buf``; returns how many were found."""
        recent = _PREFER.get(prefer)
        if recent is None:
            raise ValueError(f"prefer must be 'first' or 'recent', got {prefer!r}")
        found = self._add(self._h, tree_buf.ref, min_n, max_n, k, num_candidates, recent, partial, max_depth,
                          -1 if max_nodes is None else max(max_nodes, 0), source)
        if found < 0:
            self._fail(found, "add_to_tree", min_n, max_n, k, num_candidates)
        return found
