"""Method names used by the benchmark and the CLI -> proposers with their default configs."""

from typing import Optional

from decoding.draft import DraftModel, DraftModelConfig, DraftPLD
from decoding.hybrid import Hybrid, HybridConfig
from decoding.jacobi import Jacobi, JacobiConfig
from decoding.lookahead import Lookahead, LookaheadConfig, LookaheadPLD
from decoding.prompt_lookup import PromptLookup, PromptLookupConfig
from decoding.proposer import Proposer
from decoding.recycle import Recycle, RecycleConfig
from decoding.suffix import Suffix, SuffixConfig

METHODS = ("ar", "pld", "jacobi", "lookahead", "lookahead+pld", "recycle", "suffix", "hybrid", "draft", "draft+pld")
CONFIGS = {"pld": PromptLookupConfig, "jacobi": JacobiConfig, "lookahead": LookaheadConfig,
           "lookahead+pld": LookaheadConfig, "recycle": RecycleConfig, "suffix": SuffixConfig,
           "hybrid": HybridConfig, "draft": DraftModelConfig, "draft+pld": DraftModelConfig}


def make_proposer(name: str, *, draft_model=None, config: Optional[object] = None) -> Proposer:
    """A proposer for ``name`` with ``config`` (its method's config class; None = defaults)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    if name == "ar":
        if config is not None:
            raise ValueError("method 'ar' takes no config")
        return Proposer()
    want = CONFIGS[name]
    if config is not None and not isinstance(config, want):
        raise ValueError(f"method {name!r} takes a {want.__name__}, got {type(config).__name__}")
    if name == "pld":
        return PromptLookup(config)
    if name == "jacobi":
        return Jacobi(config)
    if name == "lookahead":
        return Lookahead(config)
    if name == "lookahead+pld":
        return LookaheadPLD(config)
    if name == "recycle":
        return Recycle(config)
    if name == "suffix":
        return Suffix(config)
    if name == "hybrid":
        return Hybrid(config)
    if draft_model is None:
        raise ValueError(f"method {name!r} needs a draft model (--draft-model): a small model sharing the tokenizer")
    return DraftPLD(draft_model, config) if name == "draft+pld" else DraftModel(draft_model, config)
