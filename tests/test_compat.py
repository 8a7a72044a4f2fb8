"""Familiar names (decoding/compat.py): the mapped proposers draft exactly what transformers'
prompt lookup and vLLM's ngram proposer draft, on random histories."""

import random

import pytest
import torch

from decoding.compat import from_lookahead, from_transformers, from_vllm
from decoding.lookahead import Lookahead, LookaheadPLD
from decoding.prompt_lookup import lookup_candidates
from kernels.backend import get_backend


def histories(n=300, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(4) for _ in range(rng.randrange(2, 40))] for _ in range(n)]


def drafts(proposer, hs):
    return [c[0] if c else [] for c in lookup_candidates(get_backend("torch"), hs, proposer.cfg)]


@pytest.mark.parametrize("k, n", [(10, 2), (3, 1), (5, 4)])
def test_from_transformers_drafts_what_transformers_drafts(k, n):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    hf = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=n, max_length=10_000)
    hs = histories()
    for h, ours in zip(hs, drafts(from_transformers(k, n), hs)):
        cand, _ = hf.get_candidates(torch.tensor([h]))
        assert ours == cand[0, len(h):].tolist(), h


def vllm_rule(h, lo, hi, k):
    """vLLM's ngram proposer, written from its description: the longest n in [lo, hi] whose
    suffix n-gram occurs earlier; its earliest occurrence; the k tokens after it (cut at the end)."""
    for n in range(min(hi, len(h) - 1), lo - 1, -1):
        for j in range(len(h) - n):
            if h[j:j + n] == h[-n:]:
                return h[j + n:j + n + k]
    return []


@pytest.mark.parametrize("cfg, lo, hi", [
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}, 2, 3),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, 3, 3),
    ({"method": "[ngram]", "num_speculative_tokens": 6, "prompt_lookup_min": 1}, 1, 1),
    ({"method": "ngram", "num_speculative_tokens": 5}, 5, 5),
])
def test_from_vllm_drafts_what_vllms_rule_drafts(cfg, lo, hi):
    p = from_vllm(cfg)
    assert (p.cfg.min_ngram, p.cfg.max_ngram, p.cfg.num_draft) == (lo, hi, cfg["num_speculative_tokens"])
    hs = histories(seed=1)
    assert drafts(p, hs) == [vllm_rule(h, lo, hi, cfg["num_speculative_tokens"]) for h in hs]


def test_from_lookahead_names():
    la = from_lookahead(window_size=5, ngram_size=4, verification_set_size=3)
    assert type(la) is Lookahead and (la.cfg.window, la.cfg.ngram, la.cfg.guesses) == (5, 4, 3)
    assert type(from_lookahead(with_pld=True)) is LookaheadPLD


@pytest.mark.parametrize("call, message", [
    (lambda: from_vllm({"method": "eagle", "num_speculative_tokens": 3}), "only 'ngram' is draft-free"),
    (lambda: from_vllm({"method": "ngram"}), "needs num_speculative_tokens"),
    (lambda: from_vllm({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4,
                        "prompt_lookup_max": 2}), r"prompt_lookup_min \(4\) must be <= prompt_lookup_max \(2\)"),
    (lambda: from_vllm({"method": "ngram", "num_speculative_tokens": 3, "model": "x"}), r"keys \['model'\]"),
    (lambda: from_vllm({"method": "ngram", "num_speculative_tokens": 0}), "num_speculative_tokens must be"),
    (lambda: from_transformers(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens must be an integer >= 1"),
    (lambda: from_lookahead(window_size=1.5), "window_size must be an integer >= 1"),
])
def test_compat_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
