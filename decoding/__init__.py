"""Decoding methods over the model's step interface: the public API.

    from decoding import generate, make_proposer, SamplingParams
    out = generate(model, prompts, make_proposer("lookahead+pld"), max_new_tokens=128)

A new method is a ``Proposer`` subclass with a ``SeqState`` subclass for its per-sequence
state (see decoding/proposer.py for the contract).
"""

from decoding.compat import from_lookahead, from_transformers, from_vllm
from decoding.draft import DraftModel, DraftModelConfig, DraftPLD
from decoding.generate import GenerationResult, generate
from decoding.hybrid import Hybrid, HybridConfig
from decoding.jacobi import Jacobi, JacobiConfig
from decoding.lookahead import Lookahead, LookaheadConfig, LookaheadPLD
from decoding.methods import METHODS, make_proposer
from decoding.planner import Planner, PlannerConfig
from decoding.prompt_lookup import PromptLookup, PromptLookupConfig
from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.recycle import Recycle, RecycleConfig
from decoding.sampling import SamplingParams
from decoding.stats import SeqStats
from decoding.suffix import Suffix, SuffixConfig
from decoding.text import TextGenerator, TextResult
from decoding.tree import StepTree

__all__ = [
    "generate", "GenerationResult", "SeqStats", "SamplingParams", "METHODS", "make_proposer",
    "Proposer", "SeqState", "Budget", "Context", "Outcome", "StepTree",
    "PromptLookup", "PromptLookupConfig", "Jacobi", "JacobiConfig", "Lookahead", "LookaheadPLD",
    "LookaheadConfig", "Recycle", "RecycleConfig", "Suffix", "SuffixConfig", "Hybrid", "HybridConfig",
    "DraftModel", "DraftModelConfig", "DraftPLD", "Planner", "PlannerConfig", "TextGenerator", "TextResult",
    "from_transformers", "from_vllm", "from_lookahead",
]
