"""Every draft source in ONE trie and ONE forward: the lookahead window (private) and its
pool n-grams, prompt lookup, the suffix trie's continuations and the model's recycled top-k
predictions. Each node carries its sources; with a step planner every node is scored by its
estimated chance of acceptance (per source, depth and rank, learned per sequence) and the
step takes the best ones the device's cost allows.

Order of growth (a node's rank among its siblings is its order of creation): the sequence's
own suffix continuations, prompt lookup, pool n-grams, the window (private), the opt-in
shared store's continuations, the recycled tree. A later source that meets an existing node
adds its bit to it.
"""

from array import array
from dataclasses import dataclass, field
from typing import Optional

from decoding import inputs
from decoding.lookahead import LookaheadConfig, LookaheadPLD, LookaheadState
from decoding.proposer import Budget, Context, Outcome, SeqState
from decoding.recycle import RecycleConfig, Table, learn_from, new_table, seed_missing
from decoding.recycle import grow_tree as grow_recycled
from decoding.suffix import SuffixConfig, SuffixStore, SuffixTrie, compiled_with, new_trie, own_store, sync
from decoding.suffix import grow_tree as grow_suffix
from decoding.tree import HARVEST, PLD, POOL, RECYCLE, STORE, SUFFIX, WINDOW, StepTree


@dataclass(slots=True)
class HybridConfig:
    lookahead: LookaheadConfig = field(default_factory=LookaheadConfig)  # window, pool and its PLD (.pld)
    recycle: RecycleConfig = field(default_factory=RecycleConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    max_nodes: int = 128  # candidate nodes per step at most (before the planner)
    # children per node of the recycled tree when a step planner picks the nodes (recycle.widths
    # without one): the planner takes few of a wide fringe, whose estimates run above what is
    # accepted, and growing and ranking it cost host time. Of (4, 2, 1), (3, 1) and (2, 1), only
    # (2, 1) kept hybrid at or above lookahead+pld in every round of every task, in both cost
    # states of the CPU (docs/DESIGN.md, "Methods: what differs from the papers"); full trees
    # (--no-plan) keep the wide one
    planned_recycle_widths: tuple[int, ...] = (2, 1)

    def __post_init__(self):
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        la = self.lookahead
        inputs.lookahead_window(la.window, la.ngram, self.max_nodes,
                                f"HybridConfig(lookahead=LookaheadConfig(window={la.window}, ngram={la.ngram}))",
                                "max_nodes")
        w = self.planned_recycle_widths
        if not w or min(w) < 1 or max(w) > self.recycle.top_k:
            raise ValueError(f"planned_recycle_widths must be a non-empty list of values in [1, recycle.top_k="
                             f"{self.recycle.top_k}], got {w}")


@dataclass(eq=False, kw_only=True)
class HybridState(LookaheadState):
    table: Table = field(default_factory=dict)
    trie: Optional[SuffixTrie] = None  # or its compiled twin (compiled_draft.CSuffixTrie)
    indexed: int = 0


class Hybrid(LookaheadPLD):
    name = "hybrid"
    sources = PLD | POOL | HARVEST | WINDOW | RECYCLE | SUFFIX  # | STORE with a store (__init__)

    def __init__(self, cfg: Optional[HybridConfig] = None, store: Optional[SuffixStore] = None):
        self.hcfg = cfg or HybridConfig()
        super().__init__(self.hcfg.lookahead)
        self.top_k = self.hcfg.recycle.top_k
        self.store = own_store(self.hcfg.suffix, store)  # other sequences' text (suffix.own_store)
        if self.store is not None:  # a source the planner sizes steps for only where it can occur
            self.sources = type(self).sources | STORE
        if not compiled_with(self.store):
            self.buf = None  # the reference drafts
        self.shared_table: Table = new_table(self.buf is not None, self.top_k)
        # the recycled tree's widths per step, planned or not (compiled_sources)
        self._widths = {True: array("i", self.hcfg.planned_recycle_widths), False: array("i", self.hcfg.recycle.widths)}

    def init_state(self, base: SeqState) -> HybridState:
        la = super().init_state(base)
        rc = self.hcfg.recycle
        table = self.shared_table if rc.shared else new_table(self.buf is not None, rc.top_k)
        if rc.seed_from_prompt:
            seed_missing(table, base.prompt, rc.top_k)
        state = HybridState(**vars(la), table=table,
                            trie=new_trie(self.hcfg.suffix.depth, compiled=self.buf is not None))
        sync(state)
        return state

    def propose(self, states: list[HybridState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        h = self.hcfg
        capped = []
        for b in budgets:  # a plain loop: a comprehension is a call of its own (decode_step)
            capped.append(Budget(max_depth=b.max_depth, max_nodes=min(b.max_nodes, h.max_nodes), planned=b.planned))
        if self.buf is not None:
            return self.propose_compiled(states, capped, ctx)
        # own suffix continuations (grow_first), prompt lookup, pool n-grams, the window
        trees = super().propose(states, capped, ctx)
        for s, b, tree in zip(states, capped, trees):
            if b.max_depth <= 0:
                continue
            if self.store is not None:  # other sequences' text, after this sequence's own sources
                shared = self.store.trie.store_match(s.tokens, h.suffix.max_match)
                if shared is not None:
                    grow_suffix(tree, self.store.trie, shared, b.max_depth, b.max_nodes, h.suffix.min_prob, STORE)
            widths = h.planned_recycle_widths if b.planned else h.recycle.widths
            grow_recycled(tree, s.table, widths, b.max_depth, b.max_nodes)
        return trees

    def grow_first(self, state: HybridState, tree: StepTree, max_depth: int, max_nodes: int) -> None:
        """The sequence's own suffix-trie continuations, before prompt lookup and the pool: where
        they meet, the suffix trie's most frequent continuation is the first child (rank 0, the
        planner's best-trusted rank) instead of whichever copy came first. With a pinned plan it
        gains more tokens per predicted time on summarization, qa and code_edit than it gives
        back on chat and code (docs/DESIGN.md, "Methods: what differs from the papers")."""
        h = self.hcfg
        match = state.trie.own_match(h.suffix.max_match)
        if match is not None:
            grow_suffix(tree, state.trie, match, max_depth, max_nodes, h.suffix.min_prob)

    def first_compiled(self, state: HybridState, max_depth: int, max_nodes: int) -> None:
        h = self.hcfg
        match = state.trie.own_match(h.suffix.max_match)
        if match is not None:
            state.trie.grow(self.buf, match, max_depth, max_nodes, h.suffix.min_prob, SUFFIX)

    def compiled_sources(self, state: HybridState, budget: Budget):
        if self.store is not None:  # the shared store's part is drafted call by call
            return None
        parts = super().compiled_sources(state, budget)
        h = self.hcfg
        if parts.keep.get("own") is not state.trie:
            parts.set_own(state.trie, h.suffix.max_match, h.suffix.min_prob)
        widths = self._widths[budget.planned]
        if parts.keep.get("table") is not state.table or parts.keep.get("widths") is not widths:
            parts.set_table(state.table, widths)
        return parts

    def last_compiled(self, state: HybridState, budget: Budget) -> None:
        """The shared store's continuations and the recycled tree, after the window (as ``propose``)."""
        h, b = self.hcfg, budget
        if b.max_depth <= 0:
            return
        if self.store is not None:
            shared = self.store.trie.store_match(state.tokens[-h.suffix.max_match:], h.suffix.max_match)
            if shared is not None:
                self.store.trie.grow(self.buf, shared, b.max_depth, b.max_nodes, h.suffix.min_prob, STORE)
        widths = h.planned_recycle_widths if b.planned else h.recycle.widths
        state.table.grow(self.buf, widths, b.max_depth, b.max_nodes, RECYCLE)

    def update(self, state: HybridState, outcome: Outcome) -> None:
        """Lookahead's update, ``learn_from`` and ``sync``. Where all three run compiled (a greedy
        step's argmax and top-k at hand), their calls of the C glue are made here, written out: a
        step pays for each Python function it goes through (decoding/compiled.py)."""
        cfg, top1, topk, k = self.cfg, outcome._top1, outcome._topk, self.hcfg.recycle.top_k
        table, pool = state.table, state.pool
        if (top1 is None or topk is None or not topk or len(topk[0]) != k or isinstance(table, dict)
                or self.buf is None or cfg.window_shift != "one"):
            super().update(state, outcome)
            learn_from(table, outcome, k)
            sync(state)
            return
        slid = pool.window_update(state.tokens, len(outcome.new_tokens), state.levels, state.real, state.tips,
                                  outcome.rows, [] if state.tips is None else top1, outcome.tree.tokens[0],
                                  cfg.pool_from_output)
        if slid is None:  # the glue did not take it: the pool is unchanged, Lookahead's Python runs
            super().update(state, outcome)
        else:
            state.levels, state.real = slid
        if not table.learn(outcome.tree.tokens, outcome.rows, outcome.path, topk):
            learn_from(table, outcome, k)
        state.trie.extend_from(state.tokens, state.indexed)  # sync
        state.indexed = len(state.tokens)

    def end(self, state: SeqState) -> None:
        if self.store is not None:
            self.store.add(state.tokens)

