"""Familiar names: the knobs of transformers, vLLM, TensorRT-LLM and the LookaheadDecoding
reference mapped onto our proposers (docs/CONFIG.md, "Familiar names").

    from decoding.compat import from_transformers, from_vllm
    proposer = from_transformers(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    proposer = from_vllm({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4})

Each returns a proposer for ``generate`` (or ``TextGenerator.generate``) that drafts what the
named implementation drafts: the same n-gram range, the same occurrence (the earliest of the
longest matching n-gram) and the same draft length, cut at the end of the history.
"""

from typing import Any, Optional

from decoding.lookahead import Lookahead, LookaheadConfig, LookaheadPLD
from decoding.prompt_lookup import PromptLookup, PromptLookupConfig


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def from_transformers(prompt_lookup_num_tokens: int = 10, max_matching_ngram_size: int = 2) -> PromptLookup:
    """transformers' ``generate(prompt_lookup_num_tokens=..., max_matching_ngram_size=...)``
    (its default n-gram size is 2; it tries every size from that down to 1)."""
    n = _positive("max_matching_ngram_size", max_matching_ngram_size)
    k = _positive("prompt_lookup_num_tokens", prompt_lookup_num_tokens)
    return PromptLookup(PromptLookupConfig(max_ngram=n, min_ngram=1, num_draft=k))


def from_vllm(speculative_config: dict) -> PromptLookup:
    """vLLM's ``speculative_config={"method": "ngram", "num_speculative_tokens": k,
    "prompt_lookup_max": M, "prompt_lookup_min": m}``; a missing bound takes the other's value,
    both missing are 5 and 5, as in vLLM."""
    cfg = dict(speculative_config)
    method = cfg.pop("method", None)
    if method not in ("ngram", "[ngram]"):
        raise ValueError(f"speculative_config method {method!r}: only 'ngram' is draft-free; for a draft model use "
                         f"make_proposer('draft', draft_model=...)")
    if "num_speculative_tokens" not in cfg:
        raise ValueError("speculative_config needs num_speculative_tokens (the draft length)")
    k = _positive("num_speculative_tokens", cfg.pop("num_speculative_tokens"))
    lo: Optional[int] = cfg.pop("prompt_lookup_min", None)
    hi: Optional[int] = cfg.pop("prompt_lookup_max", None)
    if cfg:
        raise ValueError(f"speculative_config keys {sorted(cfg)} have no counterpart here; known: method, "
                         f"num_speculative_tokens, prompt_lookup_max, prompt_lookup_min")
    if lo is None and hi is None:
        lo = hi = 5
    lo = _positive("prompt_lookup_min", hi if lo is None else lo)
    hi = _positive("prompt_lookup_max", lo if hi is None else hi)
    if lo > hi:
        raise ValueError(f"prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
    return PromptLookup(PromptLookupConfig(max_ngram=hi, min_ngram=lo, num_draft=k))


def from_lookahead(window_size: int = 7, ngram_size: int = 5, verification_set_size: int = 7,
                   with_pld: bool = False) -> Lookahead:
    """Lookahead decoding in TensorRT-LLM's names (``LookaheadDecodingConfig(max_window_size,
    max_ngram_size, max_verification_set_size)``, i.e. W, N, G) and the reference
    implementation's (``lade.config_lade(WINDOW_SIZE=W, LEVEL=N, GUESS_SET_SIZE=G)``).
    ``with_pld``: lookahead + prompt lookup in one trie (our ``lookahead+pld``)."""
    cfg = LookaheadConfig(window=_positive("window_size", window_size), ngram=_positive("ngram_size", ngram_size),
                          guesses=_positive("verification_set_size", verification_set_size))
    return LookaheadPLD(cfg) if with_pld else Lookahead(cfg)
