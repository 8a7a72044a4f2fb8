"""Method names used by the benchmark and the CLI -> proposers with their default configs."""

from typing import Optional

from decoding.draft import DraftModel, DraftModelConfig, DraftPLD
from decoding.hybrid import Hybrid, HybridConfig
from decoding.jacobi import Jacobi, JacobiConfig
from decoding.lookahead import Lookahead, LookaheadConfig, LookaheadPLD
from decoding.prompt_lookup import PromptLookup, PromptLookupConfig
from decoding.proposer import Proposer
from decoding.recycle import Recycle, RecycleConfig
from decoding.suffix import Suffix, SuffixConfig, SuffixStore

METHODS = ("ar", "pld", "jacobi", "lookahead", "lookahead+pld", "recycle", "suffix", "hybrid", "draft", "draft+pld")
CONFIGS = {"pld": PromptLookupConfig, "jacobi": JacobiConfig, "lookahead": LookaheadConfig,
           "lookahead+pld": LookaheadConfig, "recycle": RecycleConfig, "suffix": SuffixConfig,
           "hybrid": HybridConfig, "draft": DraftModelConfig, "draft+pld": DraftModelConfig}


STORE_METHODS = ("suffix", "hybrid")  # the methods that draft from a store of other sequences' text


def check_store(name: str, store: Optional[SuffixStore]) -> None:
    """A store is for the methods that draft from one (ValueError naming the argument)."""
    if store is not None and name not in STORE_METHODS:
        raise ValueError(f"store: method {name!r} drafts from no store (only {', '.join(STORE_METHODS)} do)")


def make_proposer(name: str, *, draft_model=None, config: Optional[object] = None,
                  store: Optional[SuffixStore] = None) -> Proposer:
    """A proposer for ``name`` with ``config`` (its method's config class; None = defaults).
    ``store`` (suffix, hybrid): a ``SuffixStore`` of finished sequences that outlives the
    proposer, shared by every proposer given it (a serving engine's requests, a benchmark's
    prompts); each sequence the proposer finishes goes into it."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    check_store(name, store)
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
        return Suffix(config, store)
    if name == "hybrid":
        return Hybrid(config, store)
    if draft_model is None:
        raise ValueError(f"method {name!r} needs a draft model (--draft-model): a small model sharing the tokenizer")
    return DraftPLD(draft_model, config) if name == "draft+pld" else DraftModel(draft_model, config)
