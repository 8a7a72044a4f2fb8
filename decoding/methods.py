"""Method names used by the benchmark and the CLI -> proposers with their default configs."""

from typing import Optional

from decoding.draft import DraftModel, DraftModelConfig
from decoding.generate import Proposer
from decoding.jacobi import Jacobi, JacobiConfig
from decoding.lookahead import Lookahead, LookaheadConfig
from decoding.prompt_lookup import PromptLookup, PromptLookupConfig

METHODS = ("ar", "pld", "jacobi", "lookahead", "lookahead+pld", "draft")


def make_proposer(name: str, draft_model=None, config: Optional[object] = None) -> Proposer:
    """A fresh proposer for ``name`` (one per generate call: proposers hold per-sequence state)."""
    if name == "ar":
        return Proposer()
    if name == "pld":
        return PromptLookup(config or PromptLookupConfig())
    if name == "jacobi":
        return Jacobi(config or JacobiConfig())
    if name == "lookahead":
        return Lookahead(config or LookaheadConfig())
    if name == "lookahead+pld":
        cfg = config or LookaheadConfig(with_pld=True)
        if not cfg.with_pld:
            raise ValueError("method 'lookahead+pld' needs a LookaheadConfig with with_pld=True")
        return Lookahead(cfg)
    if name == "draft":
        if draft_model is None:
            raise ValueError("method 'draft' needs a draft model (--draft-model): a small model sharing the tokenizer")
        return DraftModel(draft_model, config or DraftModelConfig())
    raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
