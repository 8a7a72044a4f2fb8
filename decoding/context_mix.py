"""Chains drafted from the text alone by mixing every context length, a token at a time.

A suffix trie drafts from one context: the longest suffix of the text that occurred before.
Its continuations are often a single earlier occurrence, and where a shorter context (seen
many times) or another text (the store of finished requests) says otherwise, a chain built
from the one context ignores it. Here each context length L = 1 .. ``max_context`` of each
trie is an expert: the distribution of what followed the text's last L tokens there (count of
each next token / their total). The next token is the one with the most probability under the
experts' mixture, each weighted by its learned reliability, and the chain goes on from the text
plus what it drafted so far, so every position is matched again, and a chain may pass from
one context, or one trie, to another (the way context-mixing compressors predict the next
symbol; a suffix-trie chain follows one path of one trie).

An expert is known by (which trie, L, how many times the context occurred: 1, 2, 3-4, 5+).
Its reliability is the mean probability it gave the token that came next, over every token
of the requests' own output it was asked about, before the trie held that token, smoothed
towards ``prior``. The drafter of one engine learns one table for all its requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

from decoding.suffix import SuffixTrie

OCCURRENCE_BUCKETS = (1, 2, 4)  # a context seen 1, 2, 3-4 or 5+ times: buckets 0 .. 3


@dataclass(slots=True)
class MixConfig:
    max_context: int = 8  # longest context matched, in tokens (below the tries' depth)
    prior: float = 0.3  # an expert's reliability before evidence
    prior_weight: float = 2.0  # pseudo tokens behind the prior

    def __post_init__(self):
        if self.max_context < 1:
            raise ValueError(f"max_context must be >= 1, got {self.max_context}")
        if not 0.0 < self.prior <= 1.0:
            raise ValueError(f"prior must be in (0, 1], got {self.prior}")
        if self.prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")


class ExpertKey(NamedTuple):
    trie: int  # index into the tries a call passes (0: the request's own text)
    length: int  # context length L
    occurrences: int  # bucket of how often the context occurred (OCCURRENCE_BUCKETS)


def occurrence_bucket(total: int) -> int:
    return sum(total > b for b in OCCURRENCE_BUCKETS)


class ContextMix:
    """The mixture and its learned reliabilities; ``tries`` is a list of suffix tries (None
    entries are skipped), the request's own first."""

    def __init__(self, cfg: Optional[MixConfig] = None):
        self.cfg = cfg or MixConfig()
        self.hits: dict[ExpertKey, float] = {}
        self.trials: dict[ExpertKey, float] = {}

    def experts(self, tries: Sequence[Optional[SuffixTrie]],
                ctx: Sequence[int]) -> list[tuple[ExpertKey, dict[int, float]]]:
        """Every expert that has something to say after ``ctx``: its key and its distribution of
        the next token. Lengths stop at the first that no trie holds (no longer one can occur)."""
        out = []
        for L in range(1, min(self.cfg.max_context, len(ctx)) + 1):
            pattern, held = list(ctx[-L:]), False
            for i, trie in enumerate(tries):
                if trie is None or L > trie.depth - 1:
                    continue
                place = trie.find(pattern)
                if place is None:
                    continue
                held = True
                kids = trie.continuations(place)  # empty where it occurred only at the text's end
                total = sum(k[2] for k in kids)
                if total:
                    out.append((ExpertKey(i, L, occurrence_bucket(total)), {tok: n / total for tok, _, n in kids}))
            if not held:
                break
        return out

    def reliability(self, key: ExpertKey) -> float:
        w = self.cfg.prior_weight
        return (self.hits.get(key, 0.0) + self.cfg.prior * w) / (self.trials.get(key, 0.0) + w)

    def predict(self, tries: Sequence[Optional[SuffixTrie]], ctx: Sequence[int]) -> Optional[tuple[int, float]]:
        """The most probable next token under the mixture and its probability there (None: no
        expert). Ties: the token an earlier expert (shorter context, own trie first) named first."""
        scores: dict[int, float] = {}
        norm = 0.0
        for key, dist in self.experts(tries, ctx):
            w = self.reliability(key)
            norm += w
            for tok, p in dist.items():
                scores[tok] = scores.get(tok, 0.0) + w * p
        if not scores:
            return None
        tok = max(scores, key=scores.get)
        return tok, scores[tok] / norm

    def learn(self, tries: Sequence[Optional[SuffixTrie]], ctx: Sequence[int], token: int) -> None:
        """``token`` followed ``ctx``: credit each expert with the probability it gave it. Call
        it before the tries hold ``token`` after ``ctx`` (else the own trie has seen the answer)."""
        for key, dist in self.experts(tries, ctx):
            self.hits[key] = self.hits.get(key, 0.0) + dist.get(token, 0.0)
            self.trials[key] = self.trials.get(key, 0.0) + 1.0

    def chain(self, tries: Sequence[Optional[SuffixTrie]], ctx: Sequence[int], depth: int,
              min_chance: float = 0.0) -> list[int]:
        """Up to ``depth`` tokens, each the mixture's choice after the text and the chain so far;
        it stops where the product of their probabilities (the chance, by the mixture, that the
        whole chain is accepted) falls below ``min_chance``. The first token is always sent."""
        text = list(ctx[-self.cfg.max_context:])
        out: list[int] = []
        chance = 1.0
        for _ in range(depth):
            got = self.predict(tries, text)
            if got is None:
                break
            tok, p = got
            chance *= p
            if out and chance < min_chance:
                break
            out.append(tok)
            text = text[1:] + [tok] if len(text) >= self.cfg.max_context else text + [tok]
        return out
