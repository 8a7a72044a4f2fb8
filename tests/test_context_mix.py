"""decoding/context_mix.py: the experts of a text, exact; the mixture's choice and probability,
exact; learning credits each expert with the probability it gave the next token, and never sees
that token in the request's own trie; chains; the ``mix`` drafter inside the vLLM proposer."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bench.vllm_replay import replay
from decoding.context_mix import ContextMix, ExpertKey, MixConfig, occurrence_bucket
from decoding.suffix import SuffixStore, SuffixTrie
from decoding.vllm import DEFAULT_MIN_CHANCE, MixProposer, TokenDrafter, VllmDrafterConfig

TEXT = [1, 2, 3, 1, 2, 4, 1, 2]


def own_trie(tokens, depth=24):
    t = SuffixTrie(depth)
    t.extend(tokens)
    return t


def store_of(*texts):
    s = SuffixStore(24, 1 << 20)
    for x in texts:
        s.add(x)
    return s.trie


def test_occurrence_buckets():
    assert [occurrence_bucket(n) for n in (1, 2, 3, 4, 5, 40)] == [0, 1, 2, 2, 3, 3]


def test_experts_of_a_text_exactly():
    mix = ContextMix()
    got = mix.experts([own_trie(TEXT)], TEXT)
    # [2] and [1, 2] each occurred 3 times, twice with a continuation (3, then 4); the longer
    # suffixes occurred only at the end (no continuation: no expert, but the search goes on)
    assert got == [(ExpertKey(0, 1, 1), {4: 0.5, 3: 0.5}), (ExpertKey(0, 2, 1), {4: 0.5, 3: 0.5})]
    # the latest continuation is named first among equal counts
    assert [list(d) for _, d in got] == [[4, 3], [4, 3]]
    # with a store: its experts after the own trie's at each length; [4, 1, 2] is in neither's
    # past, [9, 4, 1, 2] in neither at all: the search stops there
    store = store_of([7, 1, 2, 3, 9])
    got = mix.experts([own_trie(TEXT), store], TEXT)
    assert got == [(ExpertKey(0, 1, 1), {4: 0.5, 3: 0.5}), (ExpertKey(1, 1, 0), {3: 1.0}),
                   (ExpertKey(0, 2, 1), {4: 0.5, 3: 0.5}), (ExpertKey(1, 2, 0), {3: 1.0})]
    assert mix.experts([own_trie(TEXT), None], [5, 6]) == []  # never seen


def test_prediction_is_the_reliability_weighted_mixture():
    mix = ContextMix(MixConfig(prior=0.3))
    own = own_trie(TEXT)
    # two experts at prior reliability, 4 and 3 at one half each: the tie goes to the first named
    assert mix.predict([own], TEXT) == (4, pytest.approx(0.5))
    store = store_of([7, 1, 2, 3, 9])
    # 3: 0.3 * (0.5 + 1 + 0.5 + 1) = 0.9 of 0.3 * 4 = 1.2
    tok, p = mix.predict([own, store], TEXT)
    assert tok == 3 and p == pytest.approx(0.75)
    assert mix.predict([own], [5]) is None


def test_learning_credits_the_probability_given_to_the_next_token():
    cfg = MixConfig(prior=0.3, prior_weight=2.0)
    mix = ContextMix(cfg)
    own, store = own_trie(TEXT), store_of([7, 1, 2, 3, 9])
    mix.learn([own, store], TEXT, 3)
    assert mix.hits == {ExpertKey(0, 1, 1): 0.5, ExpertKey(1, 1, 0): 1.0, ExpertKey(0, 2, 1): 0.5,
                        ExpertKey(1, 2, 0): 1.0}
    assert mix.reliability(ExpertKey(0, 1, 1)) == pytest.approx((0.5 + 0.6) / 3)
    assert mix.reliability(ExpertKey(1, 2, 0)) == pytest.approx((1.0 + 0.6) / 3)
    assert mix.reliability(ExpertKey(0, 5, 3)) == pytest.approx(0.3)  # never asked: the prior
    # a store that was right now outweighs the own trie: 3 wins by more than before
    tok, p = mix.predict([own, store], TEXT)
    assert tok == 3 and p > 0.75


def test_chains_follow_a_repeated_passage_and_stop_at_the_bar():
    passage = list(range(10, 22))
    text = [1] + passage + [2, 3] + passage[:3]
    mix = ContextMix()
    own = own_trie(text)
    assert mix.chain([own], text, 5) == passage[3:8]
    # then what followed the passage, and the passage again: the chain is matched anew at each token
    assert mix.chain([own], text, 14) == passage[3:] + [2, 3] + passage[:3]
    assert mix.chain([own], text, 0) == []
    # one continuation everywhere: probability 1, no bar cuts it
    assert len(mix.chain([own], text, 30, min_chance=0.99)) == 30
    # a bar no chain reaches: the first token alone
    branching = [1, 2, 5, 1, 2, 6, 1, 2]
    assert len(mix.chain([own_trie(branching)], branching, 5, min_chance=0.9)) == 1


def test_the_drafter_learns_each_token_before_its_trie_holds_it():
    # known tokens and new ones by turns, one per call: each new token follows a context the
    # experts know, and none of them can have given it any probability, so it credits nothing. Had
    # the request's trie held a token before the mixture learned from it, the own experts would
    # have "predicted" it.
    rng = random.Random(0)
    d = TokenDrafter(VllmDrafterConfig(drafter="mix"), num_speculative_tokens=4, max_model_len=512)
    prompt = [rng.randrange(1, 50) for _ in range(60)]
    out = [x for i in range(40) for x in (rng.randrange(1, 50), 100 + i)]
    row = np.zeros((1, 256), dtype=np.int64)
    ctx = prompt + out[:1]
    row[0, :len(ctx)] = ctx
    d.propose_rows([out[:1]], [len(ctx)], row)
    credit = {}
    for tok in out[1:]:
        before = (sum(d.mix.hits.values()), sum(d.mix.trials.values()))
        row[0, len(ctx)] = tok
        ctx.append(tok)
        d.propose_rows([[tok]], [len(ctx)], row)
        credit[tok] = (sum(d.mix.hits.values()) - before[0], sum(d.mix.trials.values()) - before[1])
    new = [credit[100 + i] for i in range(40)]
    assert sum(trials > 0 for _, trials in new) >= 30 and all(hits == 0.0 for hits, _ in new)
    # copying the prompt: now the experts do predict the tokens (the same learning path credits them)
    before = sum(d.mix.hits.values())
    for tok in prompt[10:20]:
        row[0, len(ctx)] = tok
        ctx.append(tok)
        d.propose_rows([[tok]], [len(ctx)], row)
    assert sum(d.mix.hits.values()) - before > 5
    req = d.live[0]
    assert req.indexed == len(req.tokens) == len(ctx) and req.trie.find(ctx[-3:]) is not None


def test_mix_proposer_drafts_from_its_text_and_the_store():
    p = MixProposer(SimpleConfig(k=4))
    first = Rows([[50, 51, 52, 53, 54, 55, 56]])
    assert p.drafter_impl.cfg.min_chance == DEFAULT_MIN_CHANCE["mix"]
    p.propose([[56]], first.n, first.ids)
    second = Rows([[60, 61, 52, 53]])  # the first is gone: its text is in the store
    assert p.propose([[53]], second.n, second.ids) == [[54, 55, 56]]
    own = Rows([[5, 6, 7, 8, 9, 5, 6]])
    assert p.propose([[6]], own.n, own.ids) == [[7, 8, 9, 5]]


def test_mix_replays_at_least_the_hybrids_tokens_per_forward_on_the_recorded_prompts():
    # what it is for: fewer forwards than the hybrid's chains (bench/results/2026-11-26-cpu-context-mix/NOTES.md)
    run = json.loads((Path(__file__).with_name("data") / "vllm_replay_run.json").read_text())
    prompts, outputs = [r["prompt_ids"] for r in run["requests"]], [r["output_ids"] for r in run["requests"]]

    def forwards(drafter):
        got = replay(VllmDrafterConfig(drafter=drafter), run["k"], prompts, outputs)
        assert [g["new_tokens"] for g in got] == [len(o) for o in outputs]
        return sum(g["forwards"] for g in got)

    assert forwards("mix") < forwards("hybrid")


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="max_context must be >= 1"):
        MixConfig(max_context=0)
    with pytest.raises(ValueError, match="prior must be in"):
        MixConfig(prior=0.0)
    with pytest.raises(ValueError, match="prior_weight must be > 0"):
        MixConfig(prior_weight=0)
    with pytest.raises(ValueError, match=r"mix.max_context must be below suffix.depth \(24\)"):
        VllmDrafterConfig(drafter="mix", mix=MixConfig(max_context=24))


class SimpleConfig:
    def __init__(self, k, max_model_len=256):
        self.speculative_config = type("S", (), {"num_speculative_tokens": k})()
        self.model_config = type("M", (), {"max_model_len": max_model_len})()


class Rows:
    def __init__(self, contexts, width=256):
        self.ids = np.zeros((len(contexts), width), dtype=np.int32)
        self.n = np.array([len(c) for c in contexts], dtype=np.int32)
        for i, c in enumerate(contexts):
            self.ids[i, :len(c)] = c
