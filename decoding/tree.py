"""Step trees: candidate chains merged into a trie, flattened into step tokens.

Node 0 is the root: the last token of the sequence, not yet in the KV cache. Each node sits
at position (committed length + depth) and sees exactly its ancestors (and itself). A step
may carry nodes that are not candidates (the lookahead window): they hang under the root in
their own subtree, are never merged with candidates and are never accepted, so the branches
of a step stay blind to each other while sharing one mask rule.
"""

from dataclasses import dataclass, field
from operator import itemgetter

import torch

# Sources of draft nodes (bit flags: a merged node may come from several branches).
# POOL: a lookahead pool n-gram taken from the text (prompt / output); HARVEST: one the
# lookahead window produced; WINDOW: the window's own (private) nodes; RECYCLE: the model's
# own earlier top-k predictions (token recycling); SUFFIX: the suffix trie's continuations (of the
# sequence's own text); STORE: the continuations of a store of other sequences' text (a shared
# SuffixStore), kept apart so that the planner learns how far each is to be trusted.
PLD, POOL, JACOBI, DRAFT, WINDOW, HARVEST, RECYCLE, SUFFIX, STORE = 1, 2, 4, 8, 16, 32, 64, 128, 256
SOURCE_NAMES = {PLD: "pld", POOL: "pool", JACOBI: "jacobi", DRAFT: "draft", WINDOW: "window", HARVEST: "harvest",
                RECYCLE: "recycle", SUFFIX: "suffix", STORE: "store"}


def _first(xs) -> tuple:
    return (xs[0],)


@dataclass
class StepTree:
    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    sources: list[int] = field(default_factory=lambda: [0])
    candidate: list[bool] = field(default_factory=lambda: [True])  # may be accepted
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])  # candidate children by token
    extra_logits: set[int] = field(default_factory=set)  # non-candidate nodes whose logits are wanted
    # private nodes form numbered groups (a lookahead window column): a planner keeps or drops
    # whole groups, and keeping groups 0 .. g - 1 keeps every private ancestor they need
    group: list[int] = field(default_factory=lambda: [-1])
    # a proposer's own estimate, per candidate node, of its chance of being accepted given its
    # parent was (a draft model's calibrated confidence); a planner prefers it to its keyed rates
    chance: dict[int, float] = field(default_factory=dict)
    # nodes a planner must send (with their ancestors): a draft model's sampled chain, whose
    # tokens may not be dropped for what was drawn (that would bias the min(1, p / q) rule)
    pinned: set[int] = field(default_factory=set)

    @classmethod
    def root(cls, token: int) -> "StepTree":
        # every field given: each default factory would be a call of its own (decode_step)
        return cls([token], [-1], [0], [0], [True], [{}], set(), [-1], {}, set())

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_candidates(self) -> int:
        return sum(self.candidate) - 1

    def _new(self, parent: int, token: int, source: int, candidate: bool, group: int = -1) -> int:
        self.group.append(group)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.sources.append(source)
        self.candidate.append(candidate)
        self.children.append({})
        node = len(self.tokens) - 1
        if candidate:
            self.children[parent][token] = node
        return node

    def add_chain(self, chain: list[int], source: int, max_nodes: int | None = None) -> list[int]:
        """Merge a candidate chain below the root into the trie; stop creating nodes once the
        tree holds ``max_nodes`` candidates. Returns the chain's nodes (shared ones included)."""
        node, path = 0, []
        for tok in chain:
            nxt = self.add_child(node, tok, source, max_nodes)
            if nxt is None:
                break
            path.append(nxt)
            node = nxt
        return path

    def add_child(self, parent: int, token: int, source: int, max_nodes: int | None = None) -> int | None:
        """The candidate child ``token`` of ``parent``: merged with an existing one (its
        sources OR-ed), else created unless the tree already holds ``max_nodes`` candidates."""
        node = self.children[parent].get(token)
        if node is not None:
            self.sources[node] |= source
            return node
        if max_nodes is not None and self.num_candidates >= max_nodes:
            return None
        return self._new(parent, token, source, True)

    def add_private_chain(self, parent: int, chain: list[int], source: int, group: int = -1) -> list[int]:
        """Non-candidate nodes (never merged, never accepted), e.g. the lookahead window."""
        path = []
        for tok in chain:
            parent = self._new(parent, tok, source, False, group)
            path.append(parent)
        return path

    def subtree(self, keep: list[int]) -> tuple["StepTree", list[int]]:
        """The tree of the nodes ``keep`` (increasing, 0 first, every kept node's parent kept),
        and for each of its nodes the node of this tree it came from."""
        if keep[:1] != [0]:
            raise ValueError("a subtree keeps the root and the parent of every node it keeps")
        # what _new would make node by node, field by field (a kept node's depth is its own: its
        # ancestors are kept); itemgetter gathers each field in one call. Plain loops and every
        # field given: a planned step makes one, and each comprehension or default factory is a
        # call of its own (decode_step)
        new_of = {}
        for new, old in enumerate(keep):
            new_of[old] = new
        get = itemgetter(*keep) if len(keep) > 1 else _first
        tokens, candidate, old_parents = list(get(self.tokens)), list(get(self.candidate)), get(self.parents)
        parents, children = [-1], [{}]
        for new in range(1, len(keep)):
            parent = new_of.get(old_parents[new], -1)
            if parent < 0:
                raise ValueError("a subtree keeps the root and the parent of every node it keeps")
            parents.append(parent)
            children.append({})
            if candidate[new]:
                children[parent][tokens[new]] = new
        extra, chance, pinned = set(), {}, set()
        for n in self.extra_logits:
            if n in new_of:
                extra.add(new_of[n])
        for n, c in self.chance.items():
            if n in new_of:
                chance[new_of[n]] = c
        for n in self.pinned:
            if n in new_of:
                pinned.add(new_of[n])
        sub = StepTree(tokens, parents, list(get(self.depths)), list(get(self.sources)), candidate, children, extra,
                       list(get(self.group)), chance, pinned)
        sub.depths[0], sub.sources[0], sub.candidate[0], sub.group[0] = 0, 0, True, -1
        return sub, list(keep)

    def mask(self) -> torch.Tensor:
        """(T, T) bool: row i sees its ancestors and itself."""
        T = len(self.tokens)
        m = torch.zeros(T, T, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m

    def is_chain(self) -> bool:
        """Every node's parent is the previous node: the causal mask describes it."""
        for i, p in enumerate(self.parents):  # a loop: a generator is a code object of its own (decode_step)
            if p != i - 1:
                return False
        return True

    def logit_nodes(self) -> list[int]:
        """Nodes whose logits the step must compute: candidates (the root included) and
        the private nodes a proposer asked for."""
        out, candidate, extra = [], self.candidate, self.extra_logits
        for i in range(len(self.tokens)):  # a loop, as is_chain
            if candidate[i] or i in extra:
                out.append(i)
        return out

    def candidate_children(self, node: int) -> list[int]:
        return list(self.children[node].values())
