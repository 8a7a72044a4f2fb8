"""Prompt lookup decoding (Saxena 2023): drafts copied from earlier occurrences of the last
n-gram in the prompt and the sequence's own output, matched for the whole batch at once by
the ``ngram_match`` kernel."""

from dataclasses import dataclass

import torch

from decoding.proposer import Budget, Context, Proposer, SeqState
from decoding.tree import PLD, StepTree


@dataclass(slots=True)
class PromptLookupConfig:
    max_ngram: int = 3  # longest n-gram matched (tried first)
    min_ngram: int = 1  # shortest n-gram matched
    num_draft: int = 10  # continuation tokens per candidate (draft length)
    num_candidates: int = 1  # > 1: up to this many distinct continuations merged into a tree
    prefer: str = "first"  # "first" (earliest match, as the reference) or "recent"
    partial: bool = True  # accept continuations cut by the end of the history (as transformers)

    def __post_init__(self):
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram ({self.min_ngram}), got {self.max_ngram}")
        if self.num_draft < 1:
            raise ValueError(f"num_draft (draft length) must be >= 1, got {self.num_draft}")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {self.num_candidates}")
        if self.prefer not in ("first", "recent"):
            raise ValueError(f"prefer must be 'first' or 'recent', got {self.prefer!r}")


def lookup_candidates(backend, histories: list[list[int]], cfg: PromptLookupConfig,
                      device: torch.device | str = "cpu") -> list[list[list[int]]]:
    """Per history, its candidate continuations (best first) from one batched kernel call
    (the torch backend searches the lists on the host)."""
    return backend.ngram_match_lists(histories, device, min_n=cfg.min_ngram, max_n=cfg.max_ngram, k=cfg.num_draft,
                                     num_candidates=cfg.num_candidates, prefer=cfg.prefer, partial=cfg.partial)


class PromptLookup(Proposer[SeqState]):
    name = "pld"
    sources = PLD

    def __init__(self, cfg: PromptLookupConfig | None = None):
        self.cfg = cfg or PromptLookupConfig()

    def propose(self, states: list[SeqState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        trees = [StepTree.root(s.root) for s in states]
        todo = [i for i, b in enumerate(budgets) if b.max_depth > 0]
        if todo:
            found = lookup_candidates(ctx.backend, [states[i].tokens for i in todo], self.cfg, ctx.device)
            for i, chains in zip(todo, found):
                for chain in chains:
                    trees[i].add_chain(chain[:budgets[i].max_depth], PLD, budgets[i].max_nodes)
        return trees
