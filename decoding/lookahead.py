"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding"), optionally joined with prompt lookup.

One forward per step carries two branches under the sequence's last token (the root):
  * the lookahead branch: a 2D window of N - 1 levels x W columns of Jacobi guesses. Level 0
    is a trunk of W - 1 tokens after the root (column c's token at depth c); levels 1..N-2 of
    column c hang below the trunk's c-th token as a private chain. The tip of each column
    predicts one new token, which closes the column into an n-gram
        (L0[c], L1[c], ..., L_{N-2}[c], new[c])   (L0[0] is the root)
    for the pool, and becomes the newest level (the window slides down one level per step).
  * the verification branch: n-grams from the pool whose first token is the root (up to G,
    most recent first), plus prompt-lookup continuations with ``with_pld``, merged into one
    trie with the root and verified exactly like any draft tree.
The branches are blind to each other (see decoding/tree.py), so the window never changes
what is accepted. Warm-up: the window starts from prompt tokens, and a column's n-gram
enters the pool only once all its levels were produced by the model.
"""

import random
from collections import OrderedDict
from dataclasses import dataclass, field

from decoding.budget import AdaptiveDepth, BudgetConfig
from decoding.generate import Proposer, Sequence
from decoding.prompt_lookup import PromptLookupConfig, lookup_candidates
from decoding.tree import PLD, POOL, WINDOW, StepTree


@dataclass(slots=True)
class LookaheadConfig:
    window: int = 7  # W: columns of the 2D window (tokens looked ahead per level)
    ngram: int = 5  # N: n-gram size; the window has N - 1 levels
    guesses: int = 7  # G: n-grams kept per first token (LRU) and verified per step
    pool_from_prompt: bool = True  # seed the pool with the prompt's n-grams
    pool_from_output: bool = True  # add the n-grams of accepted output to the pool
    with_pld: bool = False  # also verify prompt-lookup candidates in the same trie
    # prompt lookup inside lookahead+pld: a tree of up to 4 distinct continuations (tuned on the dev split)
    pld: PromptLookupConfig = field(default_factory=lambda: PromptLookupConfig(num_candidates=4))
    max_verify: int = 64  # most candidate nodes verified per step (after trie merging)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
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


class NgramPool:
    """n-grams keyed by their first token; at most ``capacity`` per key, least recently
    added or refreshed dropped first."""

    def __init__(self, n: int, capacity: int):
        self.n, self.capacity = n, capacity
        self.table: dict[int, OrderedDict] = {}

    def add(self, ngram) -> None:
        if self.capacity == 0 or len(ngram) != self.n:
            return
        slot = self.table.setdefault(ngram[0], OrderedDict())
        rest = tuple(ngram[1:])
        if rest in slot:
            slot.move_to_end(rest)
        else:
            slot[rest] = None
            if len(slot) > self.capacity:
                slot.popitem(last=False)

    def add_all(self, tokens: list[int], start: int = 0) -> None:
        """Every n-gram of ``tokens`` that ends at index >= start + n - 1."""
        for i in range(max(0, start - self.n + 1), len(tokens) - self.n + 1):
            self.add(tokens[i:i + self.n])

    def get(self, key: int) -> list[tuple]:
        """Continuations (n - 1 tokens) after ``key``, most recent first."""
        slot = self.table.get(key)
        return list(reversed(slot)) if slot else []

    def __len__(self) -> int:
        return sum(len(s) for s in self.table.values())


class Lookahead(Proposer):
    name = "lookahead"

    def __init__(self, cfg: LookaheadConfig | None = None):
        self.cfg = cfg or LookaheadConfig()
        if self.cfg.with_pld:
            self.name = "lookahead+pld"

    def start(self, seqs, runner, sampling):
        cfg = self.cfg
        self.runner, self.backend = runner, runner.model.backend
        W, N = cfg.window, cfg.ngram
        for s in seqs:
            rng = random.Random(cfg.seed * 1_000_003 + s.sid)
            levels = [[rng.choice(s.prompt) for _ in range(W)] for _ in range(N - 1)]
            pool = NgramPool(N, cfg.guesses)
            if cfg.pool_from_prompt:
                pool.add_all(s.prompt)
            s.state.update(levels=levels, real=[[False] * W for _ in range(N - 1)], pool=pool, tips=None,
                           la_budget=AdaptiveDepth(cfg.budget), rng=rng)

    def propose(self, seqs: list[Sequence], max_depth: list[int]) -> list[StepTree]:
        cfg = self.cfg
        W, N = cfg.window, cfg.ngram
        depth = [s.state["la_budget"].depth(d) for s, d in zip(seqs, max_depth)]
        pld = [[] for _ in seqs]
        todo = [i for i, d in enumerate(depth) if d > 0]
        if cfg.with_pld and todo:
            found = lookup_candidates(self.backend, [seqs[i].history for i in todo], cfg.pld, self.runner.device)
            for i, chains in zip(todo, found):
                pld[i] = chains
        trees = []
        for s, d, pld_chains in zip(seqs, depth, pld):
            tree = StepTree.root(s.root)
            if d > 0:  # verification branch: one trie for PLD chains (first) and pool n-grams
                for chain in pld_chains:
                    tree.add_chain(chain[:d], PLD, cfg.max_verify)
                for ngram in s.state["pool"].get(s.root)[:cfg.guesses]:
                    tree.add_chain(list(ngram[:d]), POOL, cfg.max_verify)
            s.state["tips"] = None
            root_pos = self.runner.context_len(s.sid)
            if root_pos + W + N - 3 < self.runner.max_context:  # lookahead branch, if it fits
                levels = s.state["levels"]
                col_top = [0] + tree.add_private_chain(0, levels[0][1:], WINDOW)
                tips = []
                for c in range(W):
                    below = tree.add_private_chain(col_top[c], [levels[j][c] for j in range(1, N - 1)], WINDOW)
                    tips.append(below[-1] if below else col_top[c])
                tree.extra_logits.update(tips)
                s.state["tips"] = tips
            trees.append(tree)
        return trees

    def observe(self, seq, tree, rows, logits, path, new_tokens):
        cfg, st = self.cfg, seq.state
        st["la_budget"].update(len(path) - 1, bool(tree.children[path[-1]]))
        pool: NgramPool = st["pool"]
        if cfg.pool_from_output:
            hist = seq.history
            pool.add_all(hist, len(hist) - len(new_tokens))
        tips = st["tips"]
        if tips is None:
            return
        row_of = {node: j for j, node in enumerate(rows)}
        new = logits[[row_of[t] for t in tips]].argmax(-1).tolist()  # (W,) one token per column
        levels, real = st["levels"], st["real"]
        N = cfg.ngram
        for c in range(cfg.window):
            if all(real[j][c] for j in range(1 if c == 0 else 0, N - 1)):
                first = tree.tokens[0] if c == 0 else levels[0][c]
                pool.add([first] + [levels[j][c] for j in range(1, N - 1)] + [new[c]])
        levels, real = levels[1:] + [new], real[1:] + [[True] * cfg.window]
        skip = len(new_tokens) - 1 if cfg.window_shift == "accepted" else 0
        if skip > 0:
            # The root moved `skip` positions further than one: drop the window columns that
            # now lie behind it and refill the end with tokens drawn from the history.
            hist, rng = seq.history, st["rng"]
            levels = [lv[skip:] + [rng.choice(hist) for _ in range(min(skip, cfg.window))] for lv in levels]
            levels = [lv[:cfg.window] for lv in levels]
            real = [(r[skip:] + [False] * cfg.window)[:cfg.window] for r in real]
        st["levels"], st["real"] = levels, real
