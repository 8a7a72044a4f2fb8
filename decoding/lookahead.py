"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding"), optionally joined with prompt lookup (``LookaheadPLD``).

One forward per step carries two branches under the sequence's last token (the root):
  * the lookahead branch: a 2D window of N - 1 levels x W columns of Jacobi guesses. Level 0
    is a trunk of W - 1 tokens after the root (column c's token at depth c); levels 1..N-2 of
    column c hang below the trunk's c-th token as a private chain. The tip of each column
    predicts one new token, which closes the column into an n-gram
        (L0[c], L1[c], ..., L_{N-2}[c], new[c])   (L0[0] is the root)
    for the pool, and becomes the newest level (the window slides down one level per step).
  * the verification branch: n-grams from the pool whose first token is the root (up to G,
    most recent first), plus prompt-lookup continuations in ``LookaheadPLD``, merged into one
    trie with the root and verified exactly like any draft tree.
The branches are blind to each other (see decoding/tree.py), so the window never changes
what is accepted. Warm-up: the window starts from prompt tokens, and a column's n-gram
enters the pool only once all its levels were produced by the model.
"""

import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from decoding import compiled_draft, inputs
from decoding.ngram_pool import NgramPool
from decoding.prompt_lookup import (DeviceHistories, HostHistories, PromptLookupConfig, add_lookups, lookup_states,
                                    match_args)
from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.tree import HARVEST, PLD, POOL, WINDOW, StepTree


@dataclass(slots=True)
class LookaheadConfig:
    window: int = 7  # W: columns of the 2D window (tokens looked ahead per level)
    ngram: int = 5  # N: n-gram size; the window has N - 1 levels
    guesses: int = 7  # G: n-grams kept per first token (LRU) and verified per step
    pool_from_prompt: bool = True  # seed the pool with the prompt's n-grams
    pool_from_output: bool = True  # add the n-grams of accepted output to the pool
    # prompt lookup inside lookahead+pld: a tree of up to 4 distinct continuations (tuned on the dev split)
    pld: PromptLookupConfig = field(default_factory=lambda: PromptLookupConfig(num_candidates=4))
    max_verify: int = 64  # most candidate nodes verified per step (after trie merging)
    seed: int = 0  # initial window tokens (and refills) are drawn from the history with this seed
    window_shift: str = "one"  # "one": slide one level per step (the reference's default);
    # "accepted": also move the window left by the extra tokens a step accepted, refilling its end

    def __post_init__(self):
        if self.window < 2:
            raise ValueError(f"window (W) must be >= 2, got {self.window}")
        if self.ngram < 2:
            raise ValueError(f"ngram (N) must be >= 2, got {self.ngram}")
        if self.guesses < 0:
            raise ValueError(f"guesses (G) must be >= 0, got {self.guesses}")
        if self.max_verify < 1:
            raise ValueError(f"max_verify must be >= 1, got {self.max_verify}")
        if self.window_shift not in ("one", "accepted"):
            raise ValueError(f"window_shift must be 'one' or 'accepted', got {self.window_shift!r}")
        inputs.lookahead_window(self.window, self.ngram, self.max_verify,
                                f"LookaheadConfig(window={self.window}, ngram={self.ngram})", "max_verify")


# ---- the window, as pure functions over token lists ----------------------------------------
def harvest(root: int, levels: list[list[int]], real: list[list[bool]],
            new: list[Optional[int]]) -> list[tuple[int, ...]]:
    """The n-grams the window closed this step: column c gives
    (L0[c], L1[c], ..., L_{N-2}[c], new[c]) with L0[0] = the root, if the column was sent
    (``new[c]`` is not None) and every level of it is real (produced by the model; level 0
    of column 0 is the root itself, always real)."""
    out, columns, made = [], list(zip(*levels)), list(zip(*real))  # column c: its levels, top first
    for c, tip in enumerate(new):
        if tip is not None and all(made[c][1:] if c == 0 else made[c]):
            out.append((root if c == 0 else columns[c][0],) + columns[c][1:] + (tip,))
    return out


def slide(levels: list[list[int]], real: list[list[bool]], new: list[Optional[int]], skip: int,
          draw: Callable[[], int]) -> tuple[list[list[int]], list[list[bool]]]:
    """The window one step later: the oldest level drops out and ``new`` (the tips'
    predictions) becomes the newest, real level; a column that was not sent (``new[c]`` is
    None) keeps its newest token there, not real. With ``skip`` > 0 (the root moved ``skip``
    positions more than one) every level also drops its first ``skip`` columns and refills
    its end with ``draw()`` tokens (level by level, left to right), marked not real."""
    W = len(new)
    newest = [levels[-1][c] if t is None else t for c, t in enumerate(new)]
    levels, real = levels[1:] + [newest], real[1:] + [[t is not None for t in new]]
    if skip > 0:
        levels = [(lv[skip:] + [draw() for _ in range(min(skip, W))])[:W] for lv in levels]
        real = [(r[skip:] + [False] * W)[:W] for r in real]
    return levels, real


_HOOKS = ("first_compiled", "extra_compiled", "last_compiled")


def _knows_hooks(cls: type) -> bool:
    """Whether ``cls.compiled_sources`` comes from a class that has (or inherits) every hook ``cls``
    drafts with: a subclass that overrides a hook but not compiled_sources is drafted call by call."""
    def owner(name: str) -> type:
        return next(c for c in cls.__mro__ if name in c.__dict__)
    parts = owner("compiled_sources")
    return all(issubclass(parts, owner(h)) for h in _HOOKS)


@dataclass(eq=False, kw_only=True)
class LookaheadState(SeqState):
    levels: list[list[int]]  # (N - 1, W) window tokens; levels[0][0] stands for the root
    real: list[list[bool]]  # (N - 1, W) produced by the model (not drawn from the history)
    pool: NgramPool
    rng: random.Random  # draws window tokens from the history
    tips: Optional[list[int]] = None  # the window's last node per column in the step just proposed
    # its parts for one call of draft.c (compiled_draft.DraftSources, the compiled path), made on first use
    draft: Optional[compiled_draft.DraftSources] = None


class Lookahead(Proposer[LookaheadState]):
    name = "lookahead"
    State = LookaheadState
    sources = POOL | HARVEST | WINDOW

    def __init__(self, cfg: LookaheadConfig | None = None):
        self.cfg = cfg or LookaheadConfig()
        # the compiled drafting's tree buffer, or None: the reference drafts
        self.buf = compiled_draft.TreeBuf() if compiled_draft.enabled() else None
        # the compiled path drafts a sequence in one call (compiled_sources) unless a subclass grows
        # its trees with hooks of its own (it is then drafted call by call, its hooks called)
        self.one_call = self.buf is not None and _knows_hooks(type(self))

    def init_state(self, base: SeqState) -> LookaheadState:
        cfg = self.cfg
        rng = random.Random(cfg.seed * 1_000_003 + base.sid)
        prompt = base.prompt
        levels = [[rng.choice(prompt) for _ in range(cfg.window)] for _ in range(cfg.ngram - 1)]
        pool = (compiled_draft.CNgramPool if self.buf is not None else NgramPool)(cfg.ngram, cfg.guesses)
        if cfg.pool_from_prompt:
            pool.add_all(prompt)
        return LookaheadState(**base.seq_fields(), levels=levels, real=[[False] * cfg.window for _ in levels],
                              pool=pool, rng=rng)

    def grow_first(self, state: LookaheadState, tree: StepTree, max_depth: int, max_nodes: int) -> None:
        """Candidates grown before every other (they come first among their siblings); none here."""

    def extra_chains(self, states: list[LookaheadState], depth: list[int], ctx: Context) -> list[list[list[int]]]:
        """Candidate chains merged before the pool's n-grams (none here; PLD in LookaheadPLD)."""
        return [[] for _ in states]

    def propose(self, states: list[LookaheadState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        if self.buf is not None:
            return self.propose_compiled(states, budgets, ctx)
        cfg = self.cfg
        W, N = cfg.window, cfg.ngram
        depth = [b.max_depth for b in budgets]
        extra = self.extra_chains(states, depth, ctx)
        trees = []
        for s, d, b, chains in zip(states, depth, budgets, extra):
            tree = StepTree.root(s.root)
            cap = min(cfg.max_verify, b.max_nodes)
            if d > 0:  # verification branch: one trie for extra chains (first) and pool n-grams
                self.grow_first(s, tree, d, cap)
                for chain in chains:
                    tree.add_chain(chain[:d], PLD, cap)
                for ngram, origin in s.pool.items(s.root)[:cfg.guesses]:
                    tree.add_chain(list(ngram[:d]), origin, cap)
            s.tips = None
            if s.committed + W + N - 3 < ctx.max_context:  # lookahead branch, if it fits
                # column c (a planner may drop whole columns, from the right) = group c:
                # its trunk token at depth c and the levels below it
                col_top = [0]
                for c in range(1, W):
                    col_top += tree.add_private_chain(col_top[-1], [s.levels[0][c]], WINDOW, group=c)
                s.tips = []
                for c in range(W):
                    below = tree.add_private_chain(col_top[c], [s.levels[j][c] for j in range(1, N - 1)], WINDOW,
                                                   group=c)
                    s.tips.append(below[-1] if below else col_top[c])
                tree.extra_logits.update(s.tips)
            trees.append(tree)
        return trees

    # ---- the compiled drafting: the same trees, built in C (decoding/compiled_draft.py) ----
    def propose_compiled(self, states: list[LookaheadState], budgets: list[Budget], ctx: Context
                         ) -> list[StepTree]:
        """``propose`` on the compiled path: each source adds to one tree built in C, in the
        reference's order (first_compiled, extra_compiled, the pool, the window, last_compiled)."""
        cfg, buf = self.cfg, self.buf
        W, N = cfg.window, cfg.ngram
        trees = []
        for s, b in zip(states, budgets):
            d, cap, tokens = b.max_depth, min(cfg.max_verify, b.max_nodes), s.tokens
            window = len(tokens) - 1 + W + N - 3 < ctx.max_context  # s.committed and s.root, written out
            parts = self.compiled_sources(s, b) if self.one_call else None
            if parts is not None:  # the same calls, in this order, in one call of the library
                if b.max_nodes + 1 + W * (N - 1) > buf.cap:  # buf.ensure, only where it grows
                    buf.ensure(b.max_nodes + 1 + W * (N - 1))
                s.tips = buf.draft(parts, tokens[-1], d, max(cap, 0), max(b.max_nodes, 0), s.levels if window else None)
            else:
                buf.start(tokens[-1], b.max_nodes + 1 + W * (N - 1))
                if d > 0:
                    self.first_compiled(s, d, cap)
                    self.extra_compiled(s, d, cap)
                    s.pool.add_chains(buf, s.root, cfg.guesses, d, cap)
                s.tips = buf.add_window(s.levels, WINDOW) if window else None
                self.last_compiled(s, b)
            tree = buf.step_tree()
            if s.tips is not None:
                tree.extra_logits.update(s.tips)
            trees.append(tree)
        return trees

    def compiled_sources(self, state: LookaheadState, budget: Budget) -> Optional[compiled_draft.DraftSources]:
        """The sequence's parts for drafting its tree in one call (``TreeBuf.draft``): what
        first_compiled, extra_compiled, the pool and last_compiled add, here the pool; a subclass
        adds its own (None: drafted call by call)."""
        parts = state.draft
        if parts is None:
            parts = state.draft = compiled_draft.draft_sources()
            parts.set_pool(state.pool, self.cfg.guesses)
        return parts

    def first_compiled(self, state: LookaheadState, max_depth: int, max_nodes: int) -> None:
        """``grow_first`` on the compiled path (none here)."""

    def extra_compiled(self, state: LookaheadState, max_depth: int, max_nodes: int) -> None:
        """``extra_chains`` on the compiled path (none here)."""

    def last_compiled(self, state: LookaheadState, budget: Budget) -> None:
        """Sources grown after the window on the compiled path (none here)."""

    def update(self, state: LookaheadState, outcome: Outcome) -> None:
        cfg = self.cfg
        if self.buf is not None and cfg.window_shift == "one" and (slid := state.pool.window_update(
                state.tokens, len(outcome.new_tokens), state.levels, state.real, state.tips, outcome.rows,
                [] if state.tips is None else outcome._top1 or outcome.row_argmax(), outcome.tree.tokens[0],
                cfg.pool_from_output)) is not None:
            state.levels, state.real = slid  # the compiled path: the work below in one call of the C glue
            return
        if cfg.pool_from_output:  # the n-grams holding a new token: only the list's tail is read
            start = len(state.tokens) - len(outcome.new_tokens)
            low = max(0, start - state.pool.n + 1)
            state.pool.add_all(state.tokens[low:], start - low)
        if state.tips is None:
            return
        sent = [t for t in state.tips if t in outcome.rows]
        preds = dict(zip(sent, outcome.argmax(sent)))
        new = [preds.get(t) for t in state.tips]  # (W,) one token per column that was sent
        state.pool.add_many(harvest(outcome.tree.tokens[0], state.levels, state.real, new), HARVEST)
        skip = len(outcome.new_tokens) - 1 if cfg.window_shift == "accepted" else 0
        state.levels, state.real = slide(state.levels, state.real, new, skip,
                                         lambda: state.rng.choice(state.tokens))


class LookaheadPLD(Lookahead):
    """Lookahead and prompt lookup in one trie, verified in one forward."""

    name = "lookahead+pld"
    sources = PLD | POOL | HARVEST | WINDOW

    def __init__(self, cfg: LookaheadConfig | None = None):
        super().__init__(cfg)
        self.histories = DeviceHistories()
        self.host = HostHistories()  # the compiled path's

    def extra_compiled(self, state, max_depth, max_nodes):
        add_lookups(self.buf, self.host.of(state), self.cfg.pld, max_depth, max_nodes)

    def compiled_sources(self, state, budget):
        parts = super().compiled_sources(state, budget)
        hist = self.host.of(state)  # the history mirrors the tokens (a new one where the list is another)
        if parts.keep.get("hist") is not hist:
            parts.set_history(hist, **match_args(self.cfg.pld))
        return parts

    def extra_chains(self, states, depth, ctx):
        todo = [i for i, d in enumerate(depth) if d > 0]
        out = [[] for _ in states]
        if todo:
            found = lookup_states(ctx.backend, [states[i] for i in todo], self.cfg.pld, ctx.device, self.histories)
            for i, chains in zip(todo, found):
                out[i] = chains
        return out
