"""Adaptive draft budget: how deep a step drafts follows the acceptance seen so far.

Per sequence we keep a smoothed estimate of alpha, the chance that a draft token is accepted
given that its parent was. Draft token i (depth i) is then worth about alpha^i tokens, and
costs about ``token_cost`` of a one-token step (device dependent: on a GPU a step of 64
tokens costs little more than one, on a CPU each token costs). We draft while
alpha^i >= token_cost, so where nothing matches the depth falls to ``min_depth`` and a step
costs about what plain decoding costs.
"""

import math
from dataclasses import dataclass


@dataclass(slots=True)
class BudgetConfig:
    enabled: bool = True
    token_cost: float = 0.05  # cost of one more step token relative to a one-token step
    prior: float = 0.5  # alpha before any evidence
    prior_weight: float = 2.0  # pseudo-observations behind the prior
    decay: float = 0.9  # per-step forgetting of old evidence
    min_depth: int = 1

    def __post_init__(self):
        if not 0.0 < self.token_cost < 1.0:
            raise ValueError(f"token_cost must be in (0, 1), got {self.token_cost}")
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"prior must be in (0, 1), got {self.prior}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if self.min_depth < 0:
            raise ValueError(f"min_depth must be >= 0, got {self.min_depth}")


class AdaptiveDepth:
    def __init__(self, cfg: BudgetConfig):
        self.cfg = cfg
        self.hits = 0.0  # accepted draft tokens (smoothed)
        self.misses = 0.0  # rejections (at most one per step)

    @property
    def alpha(self) -> float:
        c = self.cfg
        return (self.hits + c.prior * c.prior_weight) / (self.hits + self.misses + c.prior_weight)

    def depth(self, max_depth: int) -> int:
        if not self.cfg.enabled:
            return max_depth
        a = min(self.alpha, 0.999)
        d = int(math.log(self.cfg.token_cost) / math.log(a)) if a > 0 else 0
        return max(0, min(max_depth, max(self.cfg.min_depth, d)))

    def update(self, accepted: int, rejected: bool) -> None:
        """A step accepted ``accepted`` draft tokens; ``rejected``: a draft was turned down
        (the accepted path ended at a node that had candidate children)."""
        if accepted == 0 and not rejected:
            return  # nothing was drafted: no evidence
        d = self.cfg.decay
        self.hits = d * self.hits + accepted
        self.misses = d * self.misses + float(rejected)
