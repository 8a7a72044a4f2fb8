"""Suffix drafts (SuffixDecoding, Oliaro et al. 2024; SAM decoding, Hu et al. 2024): a trie
of every substring (up to ``depth`` tokens) of the sequence's prompt + output, with counts,
built online. The longest suffix of the text (at most ``max_match`` tokens) that occurred
before and was followed by something is the match; its continuations, scored by how often
they followed (count of a child / counts of its siblings, multiplied along the path), grow a
draft tree best-first.

An opt-in ``SuffixStore`` shared across the requests of a run also indexes every finished
sequence (bounded: it stops growing at ``max_nodes``; a step's query walks at most
``max_match`` tokens); with it off a sequence sees nothing of the others.
"""

import heapq
from dataclasses import dataclass, field
from typing import Optional

from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.tree import SUFFIX, StepTree


@dataclass(slots=True)
class SuffixConfig:
    depth: int = 24  # longest substring indexed (match + continuation)
    max_match: int = 8  # longest suffix of the text used as the pattern
    max_nodes: int = 32  # draft nodes per step at most (before the planner)
    min_prob: float = 0.05  # drop continuations less likely than this (frequency along the path)
    shared: bool = False  # also draft from the finished sequences of this proposer (a SuffixStore)
    store_nodes: int = 1 << 20  # the shared store stops growing at this many trie nodes

    def __post_init__(self):
        if self.max_match < 1 or self.depth <= self.max_match:
            raise ValueError(f"need 1 <= max_match < depth, got max_match={self.max_match}, depth={self.depth}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {self.min_prob}")


class SuffixTrie:
    """Counts of every substring of at most ``depth`` tokens of the streams fed to it."""

    def __init__(self, depth: int, max_nodes: int = 1 << 30):
        self.depth, self.max_nodes = depth, max_nodes
        self.child: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.level: list[int] = [0]  # node depth = length of its substring
        # nodes of the suffixes ending at the end of the current stream, shortest first (the root)
        self.active: list[int] = [0]

    def __len__(self) -> int:
        return len(self.count)

    def extend(self, tokens: list[int]) -> None:
        child, count, level, depth, cap = self.child, self.count, self.level, self.depth, self.max_nodes
        active = self.active
        for x in tokens:
            new = [0]
            for a in active:
                la = level[a]
                if la >= depth:
                    continue
                kids = child[a]
                c = kids.get(x)
                if c is None:
                    if len(count) >= cap:
                        continue  # full: known substrings keep counting, new ones are not added
                    c = len(count)
                    kids[x] = c
                    child.append({})
                    count.append(0)
                    level.append(la + 1)
                count[c] += 1
                new.append(c)
            active = new
        self.active = active

    def new_stream(self) -> None:
        """The next tokens start a new text (no substring spans two streams)."""
        self.active = [0]

    def find(self, pattern: list[int]) -> Optional[int]:
        node = 0
        for x in pattern:
            node = self.child[node].get(x)
            if node is None:
                return None
        return node

    def own_match(self, max_match: int) -> Optional[int]:
        """The longest suffix (at most max_match tokens) of the current stream that has a
        continuation: an earlier occurrence followed by something."""
        level, child = self.level, self.child
        for node in reversed(self.active):  # longest first
            if 0 < level[node] <= max_match and child[node]:
                return node
        return None

    def store_match(self, text: list[int], max_match: int) -> Optional[int]:
        """The same for a text that is not this trie's stream (a shared store)."""
        for m in range(min(max_match, len(text)), 0, -1):
            node = self.find(text[-m:])
            if node is not None and self.child[node]:
                return node
        return None


def grow_tree(tree: StepTree, trie: SuffixTrie, match: int, max_depth: int, max_nodes: int, min_prob: float,
              source: int = SUFFIX) -> None:
    """Best-first by path frequency from the trie node ``match``, hung under the root."""
    heap = [(-1.0, 0, match, 0)]  # (-probability, tiebreak, trie node, tree node)
    tick = 0
    while heap:
        neg_p, _, tnode, node = heapq.heappop(heap)
        if tree.depths[node] >= max_depth:
            continue
        kids = trie.child[tnode]
        total = sum(trie.count[c] for c in kids.values())
        for tok, c in sorted(kids.items(), key=lambda kv: -trie.count[kv[1]]):
            p = -neg_p * trie.count[c] / total
            if p < min_prob:
                break
            child = tree.add_child(node, tok, source, max_nodes)
            if child is None:
                return
            tick += 1
            heapq.heappush(heap, (-p, tick, c, child))


class SuffixStore:
    """Finished sequences of a run in one bounded trie (opt-in sharing)."""

    def __init__(self, depth: int, max_nodes: int):
        self.trie = SuffixTrie(depth, max_nodes)

    def add(self, tokens: list[int]) -> None:
        self.trie.new_stream()
        self.trie.extend(tokens)
        self.trie.new_stream()


@dataclass(eq=False, kw_only=True)
class SuffixState(SeqState):
    trie: SuffixTrie
    indexed: int = 0  # tokens of ``tokens`` already in the trie


class Suffix(Proposer[SuffixState]):
    name = "suffix"
    State = SuffixState
    sources = SUFFIX

    def __init__(self, cfg: Optional[SuffixConfig] = None):
        self.cfg = cfg or SuffixConfig()
        self.store = SuffixStore(self.cfg.depth, self.cfg.store_nodes) if self.cfg.shared else None

    def init_state(self, base: SeqState) -> SuffixState:
        state = SuffixState(**base.seq_fields(), trie=SuffixTrie(self.cfg.depth))
        sync(state)
        return state

    def propose(self, states: list[SuffixState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
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
                    grow_tree(tree, self.store.trie, shared, b.max_depth, cap, cfg.min_prob)
            trees.append(tree)
        return trees

    def update(self, state: SuffixState, outcome: Outcome) -> None:
        sync(state)

    def end(self, state: SeqState) -> None:
        if self.store is not None:
            self.store.add(state.tokens)


def sync(state: SuffixState) -> None:
    """Index what the sequence gained since the last call."""
    state.trie.extend(state.tokens[state.indexed:])
    state.indexed = len(state.tokens)
