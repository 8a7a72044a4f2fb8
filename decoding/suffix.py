"""Suffix drafts (SuffixDecoding, Oliaro et al. 2024; SAM decoding, Hu et al. 2024): a trie
of every substring (up to ``depth`` tokens) of the sequence's prompt + output, with counts,
built online. The longest suffix of the text (at most ``max_match`` tokens) that occurred
before and was followed by something is the match; its continuations, scored by how often
they followed (count of a child / counts of its siblings, multiplied along the path), grow a
draft tree best-first.

An opt-in ``SuffixStore`` shared across the requests of a run also indexes every finished
sequence (bounded: it takes no more text at ``store_nodes``, counting nodes, once-seen entries
and tokens; a step's query walks at most ``max_match`` tokens); with it off a sequence sees
nothing of the others.
"""

import heapq
from dataclasses import dataclass
from typing import Optional, Union

from decoding import compiled_draft
from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.tree import STORE, SUFFIX, StepTree


@dataclass(slots=True)
class SuffixConfig:
    depth: int = 24  # longest substring indexed (match + continuation)
    max_match: int = 8  # longest suffix of the text used as the pattern
    max_nodes: int = 32  # draft nodes per step at most (before the planner)
    min_prob: float = 0.05  # drop continuations less likely than this (frequency along the path)
    shared: bool = False  # also draft from the finished sequences of this proposer (a SuffixStore)
    store_nodes: int = 1 << 20  # the shared store takes no more text at this size (SuffixTrie.size)

    def __post_init__(self):
        if self.max_match < 1 or self.depth <= self.max_match:
            raise ValueError(f"need 1 <= max_match < depth, got max_match={self.max_match}, depth={self.depth}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {self.min_prob}")
        if self.store_nodes < 1:
            raise ValueError(f"store_nodes must be >= 1, got {self.store_nodes}")


# A place in a SuffixTrie: a node (int, a substring seen more than once, or the root) or a
# substring seen once, as (where its one occurrence ends in the trie's text, its length).
Place = Union[int, tuple[int, int]]
SEP = -1  # in a trie's text: the end of a stream


class SuffixTrie:
    """Counts of every substring of at most ``depth`` tokens of the streams fed to it.

    Stored compressed: only substrings seen more than once are nodes. One seen once is an
    entry ``~end`` in its parent's children (where its one occurrence ends in ``text``) and
    its continuation is read from the text, so a new token costs one step per current suffix
    that occurred before (a few) instead of one per suffix up to ``depth``: indexing a long
    prompt is then a small start-up cost and the trie a small fraction of the uncompressed one
    (docs/DESIGN.md, "Host work per step")."""

    def __init__(self, depth: int, max_nodes: int = 1 << 30):
        self.depth, self.max_nodes = depth, max_nodes
        self.text: list[int] = []  # every stream fed, each new one after a SEP
        # children by token: a node id, or ~end for a substring seen once
        self.child: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.last: list[int] = [-1]  # where the node's substring last ended in text (ties between siblings)
        self.level: list[int] = [0]  # node depth = length of its substring
        # the nodes among the suffixes ending at the end of the current stream, shortest first (the
        # root first); the longer suffixes occurred only there
        self.active: list[int] = [0]
        self.size = 1  # nodes + once-seen entries + text tokens: what max_nodes bounds

    def __len__(self) -> int:
        return len(self.count)

    def extend_from(self, tokens: list[int], start: int) -> None:
        """``extend(tokens[start:])`` (the compiled twin reads the list's tail where it is)."""
        self.extend(tokens[compiled_draft.tail_start(tokens, start):])

    def extend(self, tokens: list[int]) -> None:
        """Feed tokens to the current stream (a full trie takes no more)."""
        child, count, last, level, depth, text = self.child, self.count, self.last, self.level, self.depth, self.text
        active = self.active
        for x in tokens:
            if self.size >= self.max_nodes:
                break
            e = len(text)
            text.append(x)
            added = 1
            new = [0]
            for a in active:
                la = level[a]
                if la >= depth:
                    continue
                kids = child[a]
                c = kids.get(x)
                if c is None:  # first seen here (and so are the longer ones)
                    kids[x] = ~e
                    added += 1
                    continue
                if c < 0:  # seen once before, ending at ~c: a node now, with that occurrence's continuation
                    first = ~c
                    c = len(count)
                    kids[x] = c
                    count.append(1)
                    last.append(first)
                    level.append(la + 1)
                    nxt = {}
                    if la + 1 < depth and text[first + 1] != SEP:  # first + 1 <= e: it exists
                        nxt[text[first + 1]] = ~(first + 1)
                        added += 1
                    child.append(nxt)
                    added += 1
                count[c] += 1
                last[c] = e
                new.append(c)
            active = new
            self.size += added
        self.active = active

    def new_stream(self) -> None:
        """The next tokens start a new text (no substring spans two streams)."""
        if self.text and self.text[-1] != SEP:
            self.text.append(SEP)
            self.size += 1
        self.active = [0]

    def occurrences(self, place: Optional[Place]) -> int:
        if place is None:
            return 0
        return self.count[place] if isinstance(place, int) else 1

    def length(self, place: Place) -> int:
        return self.level[place] if isinstance(place, int) else place[1]

    def continuations(self, place: Place) -> list[tuple[int, Place, int]]:
        """(token, its place, occurrences) of what followed ``place``, most frequent first
        (ties: the one that occurred last first)."""
        text = self.text
        if isinstance(place, int):
            count, last, n = self.count, self.last, self.level[place] + 1
            out = [(tok, c, count[c], last[c]) if c >= 0 else (tok, (~c, n), 1, ~c)
                   for tok, c in self.child[place].items()]
            out.sort(key=lambda k: (-k[2], -k[3]))
            return [k[:3] for k in out]
        end, n = place
        if n < self.depth and end + 1 < len(text) and text[end + 1] != SEP:
            return [(text[end + 1], (end + 1, n + 1), 1)]
        return []

    def find(self, pattern: list[int]) -> Optional[Place]:
        """The place of ``pattern``; None if it never occurred (or is longer than ``depth``)."""
        if len(pattern) > self.depth:
            return None
        node, text = 0, self.text
        for i, x in enumerate(pattern):
            c = self.child[node].get(x)
            if c is None:
                return None
            if c < 0:  # seen once: the rest must follow that occurrence
                end = ~c
                for y in pattern[i + 1:]:
                    end += 1
                    if end >= len(text) or text[end] != y:
                        return None
                return end, len(pattern)
            node = c
        return node

    def own_match(self, max_match: int) -> Optional[int]:
        """The longest suffix (at most max_match tokens) of the current stream that has a
        continuation: an earlier occurrence followed by something (a node: a suffix seen once
        occurred only here, at the end)."""
        level, child = self.level, self.child
        for node in reversed(self.active):  # longest first
            if 0 < level[node] <= max_match and child[node]:
                return node
        return None

    def store_match(self, text: list[int], max_match: int) -> Optional[Place]:
        """The same for a text that is not this trie's stream (a shared store)."""
        for m in range(min(max_match, len(text)), 0, -1):
            place = self.find(text[-m:])
            if place is not None and self.continuations(place):
                return place
        return None


def grow_tree(tree: StepTree, trie: SuffixTrie, match: Place, max_depth: int, max_nodes: int, min_prob: float,
              source: int = SUFFIX) -> None:
    """Best-first by path frequency from the trie place ``match``, hung under the root."""
    heap = [(-1.0, 0, match, 0)]  # (-probability, tiebreak, trie place, tree node)
    tick = 0
    while heap:
        neg_p, _, place, node = heapq.heappop(heap)
        if tree.depths[node] >= max_depth:
            continue
        kids = trie.continuations(place)
        total = sum(k[2] for k in kids)
        for tok, c, n in kids:
            p = -neg_p * n / total
            if p < min_prob:
                break
            child = tree.add_child(node, tok, source, max_nodes)
            if child is None:
                return
            tick += 1
            heapq.heappush(heap, (-p, tick, c, child))


def new_trie(depth: int, max_nodes: int = 1 << 30, compiled: Optional[bool] = None):
    """A ``SuffixTrie``, or its compiled twin (``compiled_draft.CSuffixTrie``, the same API)
    where the compiled drafting runs (``compiled`` None: where it is switched on and built)."""
    if compiled is None:
        compiled = compiled_draft.enabled()
    return compiled_draft.CSuffixTrie(depth, max_nodes) if compiled else SuffixTrie(depth, max_nodes)


def compiled_with(store: Optional["SuffixStore"]) -> bool:
    """Whether a proposer drafts on the compiled path: it is on and built, and the store (if
    any) is compiled too (a store made on the reference path keeps its proposers there)."""
    return compiled_draft.enabled() and (store is None or isinstance(store.trie, compiled_draft.CSuffixTrie))


class SuffixStore:
    """Finished sequences of a run in one bounded trie (opt-in sharing)."""

    def __init__(self, depth: int, max_nodes: int):
        self.trie = new_trie(depth, max_nodes)

    def add(self, tokens: list[int]) -> None:
        self.trie.new_stream()
        self.trie.extend(tokens)
        self.trie.new_stream()


def own_store(cfg: SuffixConfig, store: Optional[SuffixStore]) -> Optional[SuffixStore]:
    """A proposer's store: ``store`` when one is given (kept beyond the proposer, e.g. one per
    engine or benchmark run, so that later requests see earlier ones), else a new one with
    ``cfg.shared``, else none. Anything with ``.trie`` and ``.add(tokens)`` serves."""
    if store is None:
        return SuffixStore(cfg.depth, cfg.store_nodes) if cfg.shared else None
    if not (hasattr(store, "trie") and callable(getattr(store, "add", None))):
        raise ValueError(f"store must be a SuffixStore (or have .trie and .add), got {type(store).__name__}")
    if store.trie.depth != cfg.depth:
        raise ValueError(f"store indexes substrings of {store.trie.depth} tokens, the config {cfg.depth} "
                         "(SuffixConfig.depth): build the store with the same depth")
    return store


@dataclass(eq=False, kw_only=True)
class SuffixState(SeqState):
    trie: SuffixTrie
    indexed: int = 0  # tokens of ``tokens`` already in the trie


class Suffix(Proposer[SuffixState]):
    name = "suffix"
    State = SuffixState
    sources = SUFFIX  # | STORE with a store (__init__)

    def __init__(self, cfg: Optional[SuffixConfig] = None, store: Optional["SuffixStore"] = None):
        self.cfg = cfg or SuffixConfig()
        self.store = own_store(self.cfg, store)
        if self.store is not None:  # a source the planner sizes steps for only where it can occur
            self.sources = type(self).sources | STORE
        # the compiled drafting's tree buffer, or None: the reference drafts
        self.buf = compiled_draft.TreeBuf() if compiled_with(self.store) else None
        # without a store, a tree drafted in one call (TreeBuf.draft): the sequence's own
        # continuations, its trie set before its call
        self.parts = None
        if self.buf is not None and self.store is None:
            self.parts = compiled_draft.draft_sources()
            self.parts.set_own(new_trie(self.cfg.depth, compiled=True), self.cfg.max_match, self.cfg.min_prob)

    def init_state(self, base: SeqState) -> SuffixState:
        state = SuffixState(**base.seq_fields(), trie=new_trie(self.cfg.depth, compiled=self.buf is not None))
        sync(state)
        return state

    def propose(self, states: list[SuffixState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        if self.buf is not None:
            return self._propose_compiled(states, budgets)
        cfg, trees = self.cfg, []
        for s, b in zip(states, budgets):
            tree = StepTree.root(s.root)
            cap = min(b.max_nodes, cfg.max_nodes)
            match = s.trie.own_match(cfg.max_match)
            if match is not None and b.max_depth > 0:
                grow_tree(tree, s.trie, match, b.max_depth, cap, cfg.min_prob)
            if self.store is not None and b.max_depth > 0:
                shared = self.store.trie.store_match(s.tokens, cfg.max_match)
                if shared is not None:
                    grow_tree(tree, self.store.trie, shared, b.max_depth, cap, cfg.min_prob, STORE)
            trees.append(tree)
        return trees

    def _propose_compiled(self, states: list[SuffixState], budgets: list[Budget]) -> list[StepTree]:
        """``propose`` with the tries' compiled twins, the tree built in C."""
        cfg, buf, parts, trees = self.cfg, self.buf, self.parts, []
        for s, b in zip(states, budgets):
            cap = min(b.max_nodes, cfg.max_nodes)
            if parts is not None:  # own_match and grow in one call of the library
                buf.ensure(cap + 1)
                parts.own, parts.keep["own"] = s.trie._t, s.trie  # set_own's handle, its arguments set once
                buf.draft(parts, s.root, b.max_depth, max(cap, 0), 0, None)
                trees.append(buf.step_tree())
                continue
            buf.start(s.root, cap + 1)
            if b.max_depth > 0:
                match = s.trie.own_match(cfg.max_match)
                if match is not None:
                    s.trie.grow(buf, match, b.max_depth, cap, cfg.min_prob, SUFFIX)
                if self.store is not None:
                    shared = self.store.trie.store_match(s.tokens[-cfg.max_match:], cfg.max_match)
                    if shared is not None:
                        self.store.trie.grow(buf, shared, b.max_depth, cap, cfg.min_prob, STORE)
            trees.append(buf.step_tree())
        return trees

    def update(self, state: SuffixState, outcome: Outcome) -> None:
        sync(state)

    def end(self, state: SeqState) -> None:
        if self.store is not None:
            self.store.add(state.tokens)


def sync(state: SuffixState) -> None:
    """Index what the sequence gained since the last call."""
    state.trie.extend_from(state.tokens, state.indexed)
    state.indexed = len(state.tokens)
