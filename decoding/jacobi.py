"""Jacobi decoding (Santilli et al. 2023; Song et al. 2021): keep a guess of the next m
tokens, verify it as a chain, and replace it with the model's own predictions at every
guessed position (one fixed-point iteration per step). Under greedy decoding a position
whose prefix is right is right for good, so a step never gains less than plain decoding."""

from dataclasses import dataclass

from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.tree import JACOBI, StepTree


@dataclass(slots=True)
class JacobiConfig:
    window: int = 8  # guessed tokens per step (m)

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window (guessed tokens) must be >= 1, got {self.window}")


def initial_guess(prompt: list[int], window: int) -> list[int]:
    """The prompt's tail, repeated to ``window`` tokens (any guess converges; this one is free)."""
    tail = prompt[-window:]
    return (tail * window)[:window]


def next_guess(chain_preds: list[int], accepted: int, root: int, window: int) -> list[int]:
    """The next Jacobi iterate. ``chain_preds[j]`` is the model's prediction after chain node
    j (node 0 = the old root), a guess for position j + 1; after ``accepted`` draft tokens the
    new ``root`` (the step's last token) sits at position accepted + 1. What follows it is
    guessed by ``chain_preds[accepted + 1:]``, padded with its last token (the root when
    nothing is left) to ``window`` tokens."""
    fresh = chain_preds[accepted + 1:]
    fill = fresh[-1:] or [root]
    return (fresh + fill * window)[:window]


@dataclass(eq=False, kw_only=True)
class JacobiState(SeqState):
    guess: list[int]  # the current guess of the tokens after the root


class Jacobi(Proposer[JacobiState]):
    name = "jacobi"
    State = JacobiState
    sources = JACOBI

    def __init__(self, cfg: JacobiConfig | None = None):
        self.cfg = cfg or JacobiConfig()

    def init_state(self, base: SeqState) -> JacobiState:
        return JacobiState(**base.seq_fields(), guess=initial_guess(base.prompt, self.cfg.window))

    def propose(self, states: list[JacobiState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        trees = []
        for s, b in zip(states, budgets):
            tree = StepTree.root(s.root)
            tree.add_chain(s.guess[:min(b.max_depth, b.max_nodes)], JACOBI)
            trees.append(tree)
        return trees

    def update(self, state: JacobiState, outcome: Outcome) -> None:
        chain = sorted(outcome.rows)  # a chain: node j sits at depth j
        state.guess = next_guess(outcome.argmax(chain), outcome.accepted, state.root, self.cfg.window)
