"""Target distributions: temperature, top-k and top-p applied to logits.

Every verifier sees the same processed distribution at every tree node, which is what
keeps speculative sampling exact: the output follows exactly these probabilities.
"""

from dataclasses import dataclass
from typing import Optional

import torch

from decoding import inputs


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: Optional[int] = None

    def __post_init__(self):
        # finite numbers in range (nan / inf would sample garbage or fail inside torch); the
        # command line checks its flags with the same function and messages
        inputs.sampling(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """(R, V) logits -> (R, V) fp32 probabilities after temperature, top-k, top-p.
    Greedy params give the one-hot argmax distribution."""
    logits = logits.float()
    if sp.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sp.temperature
    if sp.top_k and sp.top_k < logits.shape[-1]:
        kth = logits.topk(sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sp.top_p < 1.0:
        # stable: of equal logits the lower ids come first, so that where a tie straddles the
        # cut the same tokens stay whatever the sort's implementation or the batch's shape (an
        # unstable sort keeps an arbitrary subset, and rows verified in a batch could then get
        # another target than the same row sampled alone)
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the top one always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= sp.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    """One token from a (V,) distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))
