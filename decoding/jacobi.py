"""Jacobi decoding (Santilli et al. 2023; Song et al. 2021): keep a guess of the next m
tokens, verify it as a chain, and replace it with the model's own predictions at every
guessed position (one fixed-point iteration per step). Under greedy decoding a position
whose prefix is right is right for good, so a step never gains less than plain decoding."""

from dataclasses import dataclass, field

from decoding.budget import AdaptiveDepth, BudgetConfig
from decoding.generate import Proposer, Sequence
from decoding.tree import JACOBI, StepTree


@dataclass(slots=True)
class JacobiConfig:
    window: int = 8  # guessed tokens per step (m)
    budget: BudgetConfig = field(default_factory=lambda: BudgetConfig(enabled=False))

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window (guessed tokens) must be >= 1, got {self.window}")


class Jacobi(Proposer):
    name = "jacobi"

    def __init__(self, cfg: JacobiConfig | None = None):
        self.cfg = cfg or JacobiConfig()

    def start(self, seqs, runner, sampling):
        for s in seqs:
            # first guess: the prompt's tail (any guess converges; this one costs nothing)
            tail = s.prompt[-self.cfg.window:]
            s.state["guess"] = (tail * self.cfg.window)[:self.cfg.window]
            s.state["jacobi_budget"] = AdaptiveDepth(self.cfg.budget)

    def propose(self, seqs: list[Sequence], max_depth: list[int]) -> list[StepTree]:
        trees = []
        for s, d in zip(seqs, max_depth):
            tree = StepTree.root(s.root)
            tree.add_chain(s.state["guess"][:s.state["jacobi_budget"].depth(d)], JACOBI)
            trees.append(tree)
        return trees

    def observe(self, seq, tree, rows, logits, path, new_tokens):
        # The chain's predictions after the accepted point are the next iterate of the guess:
        # node j predicts position j + 1; the new root sits at position len(path).
        preds = logits.argmax(-1).tolist()  # rows == every node of a chain
        fresh = preds[len(path):]
        fill = fresh[-1:] or [seq.root]
        seq.state["guess"] = (fresh + fill * self.cfg.window)[:self.cfg.window]
        seq.state["jacobi_budget"].update(len(path) - 1, len(path) < len(tree))
