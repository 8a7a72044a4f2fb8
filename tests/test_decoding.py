"""Every speculative method is lossless (greedy output token-identical to plain greedy) and
effective (it accepts drafts where plain decoding cannot), and the effectiveness check
rejects a proposer whose drafts are random."""

import random
import re

import pytest
import torch

from decoding import (Budget, Context, DraftModel, DraftModelConfig, DraftPLD, HybridConfig, JacobiConfig,
                      LookaheadConfig, Proposer, PromptLookup, PromptLookupConfig, RecycleConfig, SamplingParams,
                      SeqState, SuffixConfig, generate, make_proposer)
from decoding.methods import METHODS
from decoding.tree import PLD, StepTree
from helpers import ours_from_hf, tiny_draft, tiny_hf_model
from kernels.backend import TorchBackend

SPEC = [m for m in METHODS if m != "ar"]


def proposer(name, model, small=False):
    if name == "draft+pld":  # the draft model's chain and prompt lookup in one trie
        return DraftPLD(tiny_draft(model, 1) if small else model, DraftModelConfig(num_draft=4))
    if name == "draft":
        # the real model drafts for itself (every greedy draft is accepted: the acceptance
        # path is exercised); the tiny model gets a 1-layer truncation (mostly rejected)
        return DraftModel(tiny_draft(model, 1) if small else model, DraftModelConfig(num_draft=4))
    if small and name.startswith("lookahead"):
        return make_proposer(name, config=LookaheadConfig(window=3, ngram=3, guesses=3))
    if small and name == "hybrid":
        return make_proposer(name, config=HybridConfig(lookahead=LookaheadConfig(window=3, ngram=3, guesses=3),
                                                       recycle=RecycleConfig(max_nodes=12),
                                                       suffix=SuffixConfig(max_nodes=8), max_nodes=24))
    return make_proposer(name)


def outputs(results):
    return [r.output_ids for r in results]


def tau(results) -> float:
    """New tokens per decoding forward over a batch (the prefill's first token excluded):
    exactly 1 for plain decoding."""
    return sum(len(r.output_ids) - 1 for r in results) / sum(r.stats.forwards for r in results)


# ---- the real default model (torch backend, fp32) -------------------------------------------
@pytest.fixture(scope="module")
def real4(smol):
    """4 real prompts (the shortest chat, code, summarization and QA prompts of the suite's
    test split, to keep CI fast) and their plain greedy outputs."""
    from bench.data.suite import load_suite

    model, tok = smol
    prompts = []
    for task in ("chat", "code", "summarization", "qa"):
        r = min(load_suite(tasks=task, split="test"), key=lambda r: r["prompt_tokens"])
        text = r["turns"][0] if task == "chat" else r["prompt"]
        prompts.append(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False))
    ref = [generate(model, [p], max_new_tokens=32)[0].output_ids for p in prompts]
    return prompts, ref


@pytest.mark.parametrize("name", SPEC)
def test_real_model_greedy_lossless(smol, real4, name):
    model, _ = smol
    prompts, ref = real4
    assert outputs(generate(model, prompts, proposer(name, model), max_new_tokens=32)) == ref  # ragged batch of 4
    # batch 1: the chat prompt (the longer QA prompt alone runs under `slow`)
    assert generate(model, [prompts[0]], proposer(name, model), max_new_tokens=32)[0].output_ids == ref[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", SPEC)
def test_real_model_greedy_lossless_long_prompt_alone(smol, real4, name):
    model, _ = smol
    prompts, ref = real4
    assert generate(model, [prompts[3]], proposer(name, model), max_new_tokens=32)[0].output_ids == ref[3]


# ---- tiny random model: both kernel backends ---------------------------------------------------
_TINY = {}
_TINY_REF = {}  # plain greedy outputs of TINY_PROMPTS, once per backend


def tiny_model(kernel: str):
    if kernel not in _TINY:
        _TINY[kernel] = ours_from_hf(tiny_hf_model("llama", seed=3), kernel=kernel).model
    return _TINY[kernel]


TINY_PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 9], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 11, 12],
                [40], [7, 7, 7, 7, 8, 8]]
# Triton (interpreted on a CPU) sees every step shape through these: a chain (jacobi), a tree
# with a private window (hybrid), a draft model's own cache (draft); the rest run under `slow`.
TRITON_DEFAULT = ("jacobi", "hybrid", "draft")
BACKEND_CASES = [("torch", m) for m in SPEC] + [
    pytest.param("triton", m, marks=() if m in TRITON_DEFAULT else pytest.mark.slow) for m in SPEC]


@pytest.mark.parametrize("kernel, name", BACKEND_CASES)
def test_tiny_greedy_lossless_both_backends(kernel, name):
    tiny = tiny_model(kernel)
    if kernel not in _TINY_REF:
        _TINY_REF[kernel] = [generate(tiny, [p], max_new_tokens=14, eos_token_ids=())[0].output_ids
                             for p in TINY_PROMPTS]
    ref = _TINY_REF[kernel]
    res = generate(tiny, TINY_PROMPTS, proposer(name, tiny, small=True), max_new_tokens=14, eos_token_ids=())
    assert outputs(res) == ref
    assert all(len(o) == 14 for o in ref)  # no EOS configured: max_new_tokens is exact


SAMPLED = SamplingParams(temperature=0.8, top_k=8, top_p=0.95, seed=4)


@pytest.mark.parametrize("name", ["hybrid", "jacobi"])
def test_sampling_on_the_triton_backend_draws_what_the_torch_backend_draws(name):
    """The Triton kernels (interpreted here) feed the same verifiers: with the same seeds, 14
    sampled tokens per prompt equal the torch backend's (their logits differ by rounding only,
    far below where a draw could fall on the other side of a boundary)."""
    got = {k: outputs(generate(tiny_model(k), TINY_PROMPTS, proposer(name, tiny_model(k), small=True),
                               max_new_tokens=14, sampling=SAMPLED, eos_token_ids=()))
           for k in ("torch", "triton")}
    assert got["torch"] == got["triton"] and all(len(o) == 14 for o in got["torch"])
    plain = outputs(generate(tiny_model("torch"), TINY_PROMPTS, max_new_tokens=14, sampling=SAMPLED, eos_token_ids=()))
    assert plain != got["torch"]  # the method drew its own way (the check is not ar against itself)


@pytest.mark.parametrize("name", ["pld", "lookahead+pld", "recycle", "suffix", "hybrid"])
def test_a_sampled_sequence_stops_at_an_eos_inside_its_steps(tiny_torch, name):
    """Sampling with drafts: making a token of the output an EOS cuts the output just after its
    first occurrence (finish reason eos), whether it came as an accepted draft or a bonus."""
    prompts = repetitive_prompts(tiny_torch)
    free = generate(tiny_torch, prompts, make_proposer(name), max_new_tokens=20, sampling=SAMPLED, eos_token_ids=())
    for i, r in enumerate(free):
        out = r.output_ids
        eos = out[len(out) // 2]
        cut = out[:out.index(eos) + 1]
        again = generate(tiny_torch, prompts, make_proposer(name), max_new_tokens=20, sampling=SAMPLED,
                         eos_token_ids=(eos,))
        assert again[i].output_ids == cut and again[i].finish_reason == "eos", (name, i)


# ---- effectiveness: drafts that plain decoding cannot have -----------------------------------------
@pytest.fixture(scope="module")
def tiny_torch():
    return ours_from_hf(tiny_hf_model("llama", seed=3)).model


def repetitive_prompts(model):
    """Prompts whose greedy continuations repeat: a constant run, the model's own text, a
    repeated phrase (the model's continuations fall into short cycles)."""
    own = generate(model, [[40]], max_new_tokens=24, eos_token_ids=())[0].output_ids
    return [[7, 7, 7, 7, 8, 8], [40] + own, [5, 6, 7, 8] * 4]


MIN_TAU = 1.3  # plain decoding: exactly 1.0; measured here 1.5 (jacobi) to 4.4 (draft), random drafts 1.02


class Scrambled(Proposer):
    """A broken proposer: the method's own trees, with every candidate token replaced by a
    random one (the shape, the window and the method's learning are kept)."""

    def __init__(self, inner: Proposer, vocab: int):
        self.inner, self.vocab, self.rng = inner, vocab, random.Random(0)
        self.name = "scrambled-" + inner.name

    def init_state(self, base):
        return self.inner.init_state(base)

    def begin(self, states, ctx):
        self.inner.begin(states, ctx)

    def propose(self, states, budgets, ctx):
        trees = self.inner.propose(states, budgets, ctx)
        for t in trees:
            for node in range(1, len(t)):
                if t.candidate[node]:
                    t.tokens[node] = self.rng.randrange(self.vocab)
            t.children = [{} for _ in t.tokens]
            for node in range(1, len(t)):
                if t.candidate[node]:
                    t.children[t.parents[node]].setdefault(t.tokens[node], node)
        return trees

    def verify(self, state, tree, logits, rows, sampling, *, top1=None):
        return self.inner.verify(state, tree, logits, rows, sampling, top1=top1)

    def update(self, state, outcome):
        self.inner.update(state, outcome)

    def end(self, state):
        self.inner.end(state)


def effective_tau(model, prop) -> float:
    prompts = repetitive_prompts(model)
    ref = [generate(model, [p], max_new_tokens=32, eos_token_ids=())[0].output_ids for p in prompts]
    res = generate(model, prompts, prop, max_new_tokens=32, eos_token_ids=())
    assert outputs(res) == ref  # lossless either way
    return tau(res)


@pytest.mark.parametrize("name", SPEC)
def test_each_method_accepts_drafts_plain_decoding_cannot(tiny_torch, name):
    prop = (DraftPLD if name == "draft+pld" else DraftModel)(tiny_torch, DraftModelConfig(num_draft=4)) \
        if name.startswith("draft") else make_proposer(name)
    assert effective_tau(tiny_torch, prop) >= MIN_TAU
    assert effective_tau(tiny_torch, Proposer()) == 1.0


@pytest.mark.parametrize("name", SPEC)
def test_effectiveness_check_rejects_random_drafts(tiny_torch, name):
    inner = (DraftPLD if name == "draft+pld" else DraftModel)(tiny_torch, DraftModelConfig(num_draft=4)) \
        if name.startswith("draft") else make_proposer(name)
    assert effective_tau(tiny_torch, Scrambled(inner, tiny_torch.cfg.vocab_size)) < MIN_TAU


# ---- lookahead variants, EOS, statistics --------------------------------------------------------------
@pytest.mark.parametrize("name, cfg", [
    ("lookahead", LookaheadConfig(window=4, ngram=2, guesses=2)),  # N = 2: the window is one level
    ("lookahead+pld", LookaheadConfig(window=3, ngram=4, guesses=2, window_shift="accepted")),
    ("lookahead", LookaheadConfig(window=5, ngram=3, guesses=0, pool_from_prompt=False, pool_from_output=False)),
])
def test_lookahead_variants_lossless(tiny_torch, name, cfg):
    ref = [generate(tiny_torch, [p], max_new_tokens=24, eos_token_ids=())[0].output_ids for p in TINY_PROMPTS]
    res = generate(tiny_torch, TINY_PROMPTS, make_proposer(name, config=cfg), max_new_tokens=24, eos_token_ids=())
    assert outputs(res) == ref


class RecordingPLD(PromptLookup):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.steps = []

    def update(self, state, outcome):
        super().update(state, outcome)
        self.steps.append((outcome.accepted, list(outcome.new_tokens)))


def test_eos_inside_accepted_draft_ends_sequence(tiny_torch):
    model = tiny_torch
    base = generate(model, [[40]], max_new_tokens=12, eos_token_ids=())[0].output_ids
    # find a prompt and EOS that PLD reaches inside an accepted draft: the last step accepted
    # at least as many drafts as tokens it kept, so the EOS was a draft token, not the bonus
    found = None
    for j in range(2, 12):
        prompt = [40] + base[:j]  # the model's own text: its continuation repeats the prompt
        plain = generate(model, [prompt], max_new_tokens=30, eos_token_ids=())[0].output_ids
        for eos in dict.fromkeys(plain[1:]):
            rec = RecordingPLD(PromptLookupConfig())
            out = generate(model, [prompt], rec, max_new_tokens=30, eos_token_ids=(eos,))[0]
            if not rec.steps:  # the EOS came first, from the prefill
                continue
            drafts, kept = rec.steps[-1]
            if drafts >= len(kept) > 1:
                found = eos
                assert out.output_ids == plain[:plain.index(eos) + 1] and out.finish_reason == "eos"
                break
        if found is not None:
            break
    assert found is not None
    cut = plain[:plain.index(found) + 1]
    for name in METHODS:
        res = generate(model, [prompt, TINY_PROMPTS[0]], proposer(name, model, small=True), max_new_tokens=30,
                       eos_token_ids=(found,))
        assert res[0].output_ids == cut and res[0].finish_reason == "eos", name


def test_stats_are_consistent(tiny_torch):
    res = generate(tiny_torch, TINY_PROMPTS, make_proposer("lookahead+pld"), max_new_tokens=16, eos_token_ids=())
    for r in res:
        st = r.stats
        assert sum(k * v for k, v in st.accepted_hist.items()) == len(r.output_ids) - 1  # first token: prefill
        assert sum(st.accepted_hist.values()) == st.forwards
        assert all(st.accepted[b] <= st.proposed[b] for b in st.accepted)


def test_step_clock_splits_every_step_into_its_phases(tiny_torch, monkeypatch):
    """Every decoding step is clocked once; the forward phase is the model's forward (a slowed
    forward lands there, not in the host phases) and the phases add up to the loop's time."""
    import time

    from decoding.stats import PHASES, StepClock
    from models.runner import ModelRunner

    forward = ModelRunner.forward

    def slow(self, *a, **kw):
        time.sleep(0.01)
        return forward(self, *a, **kw)

    monkeypatch.setattr(ModelRunner, "forward", slow)
    clock = StepClock()
    t = time.perf_counter()
    res = generate(tiny_torch, TINY_PROMPTS, make_proposer("hybrid"), max_new_tokens=12, eos_token_ids=(),
                   step_clock=clock)
    wall = (time.perf_counter() - t) * 1e3
    assert clock.steps == max(r.stats.forwards for r in res) > 1  # one clocked step per batch forward
    per = clock.per_step()
    assert set(per) == set(PHASES) | {"host", "steps"} and all(per[p] >= 0 for p in PHASES)
    assert per["forward"] >= 10.0  # the sleep is inside the forward phase
    assert all(per[p] < 10.0 for p in PHASES if p != "forward")
    assert per["propose"] > 0 and per["verify"] > 0
    assert per["host"] == pytest.approx(sum(per[p] for p in PHASES if p != "forward"))
    assert sum(clock.ms.values()) < wall  # the prefill is not a step
    with pytest.raises(ValueError, match="step_clock must be a decoding.stats.StepClock or None"):
        generate(tiny_torch, TINY_PROMPTS, max_new_tokens=2, step_clock={})


# ---- proposers without a model, configurations ----------------------------------------------------
def ctx(**kw):
    return Context(backend=TorchBackend(), device=torch.device("cpu"), max_context=kw.get("max_context", 256),
                   vocab_size=97, max_new_tokens=10, sampling=SamplingParams())


def test_pld_proposes_the_seed_continuation():
    p = make_proposer("pld", config=PromptLookupConfig(max_ngram=3, num_draft=3))
    state = p.init_state(SeqState(0, [1, 2, 3, 4, 1, 2, 3], 6))
    assert p.propose([state], [Budget(max_depth=9)], ctx())[0].tokens == [3, 4, 1, 2]
    assert p.propose([state], [Budget(max_depth=2)], ctx())[0].tokens == [3, 4, 1]  # depth limit
    assert p.propose([state], [Budget(max_depth=9, max_nodes=1)], ctx())[0].tokens == [3, 4]  # node cap


def test_lookahead_window_only_when_it_fits():
    p = make_proposer("lookahead", config=LookaheadConfig(window=3, ngram=3, guesses=2))
    state = p.init_state(SeqState(0, [1, 2, 3, 1, 2, 3], 6))
    tree = p.propose([state], [Budget(max_depth=5)], ctx())[0]
    assert state.tips is not None and len(state.tips) == 3 and tree.num_candidates == 2  # pool: (3, 1, 2)
    assert len(tree) == 1 + 2 + 2 + 3  # root, candidates, trunk, one more level per column
    tree = p.propose([state], [Budget(max_depth=5)], ctx(max_context=8))[0]  # positions would pass the context
    assert state.tips is None and len(tree) == 3


@pytest.mark.parametrize("make, match", [
    (lambda: LookaheadConfig(window=1), "window"),
    (lambda: LookaheadConfig(ngram=1), "ngram"),
    (lambda: LookaheadConfig(guesses=-1), "guesses"),
    (lambda: LookaheadConfig(window_shift="two"), "window_shift"),
    (lambda: PromptLookupConfig(num_draft=0), "num_draft"),
    (lambda: PromptLookupConfig(min_ngram=3, max_ngram=2), "max_ngram"),
    (lambda: JacobiConfig(window=0), "window"),
    (lambda: DraftModelConfig(num_draft=0), "num_draft"),
    (lambda: DraftModelConfig(max_draft=0), "max_draft .* >= 1"),
    (lambda: DraftModelConfig(bins=0), "bins must be >= 1"),
    (lambda: DraftModelConfig(first_prior=1.0), r"first_prior must be in \(0, 1\)"),
    (lambda: make_proposer("beam"), "unknown method"),
    (lambda: make_proposer("draft"), "draft model"),
    (lambda: make_proposer("pld", config=JacobiConfig()), "PromptLookupConfig"),
])
def test_bad_configurations(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_draft_model_with_another_vocabulary(tiny_torch):
    other = ours_from_hf(tiny_hf_model("llama", seed=4, vocab_size=50)).model
    with pytest.raises(ValueError, match="vocabulary"):
        generate(tiny_torch, [[1, 2, 3]], DraftModel(other), max_new_tokens=4)


def test_generate_options_are_keyword_only(tiny_torch):
    with pytest.raises(TypeError):
        generate(tiny_torch, [[1, 2]], None, 4)


def test_on_tokens_streams_and_stops(tiny_torch):
    ref = [generate(tiny_torch, [p], max_new_tokens=12, eos_token_ids=())[0].output_ids for p in TINY_PROMPTS]
    streamed = {i: [] for i in range(len(TINY_PROMPTS))}

    def on_tokens(i, tokens):
        streamed[i] += tokens
        return i == 1 and len(streamed[i]) >= 5  # stop the second sequence after 5 tokens

    res = generate(tiny_torch, TINY_PROMPTS, make_proposer("lookahead+pld"), max_new_tokens=12, eos_token_ids=(),
                   on_tokens=on_tokens)
    assert [streamed[i] for i in range(len(TINY_PROMPTS))] == [r.output_ids for r in res]
    assert res[1].finish_reason == "stop" and 5 <= len(res[1].output_ids) < 12
    assert res[1].output_ids == ref[1][:len(res[1].output_ids)]
    assert [r.output_ids for i, r in enumerate(res) if i != 1] == [o for i, o in enumerate(ref) if i != 1]


@pytest.mark.parametrize("name, cfg", [("suffix", SuffixConfig), ("hybrid", None)])
@pytest.mark.parametrize("shared", [False, True])
def test_a_sequence_sees_others_only_through_an_opt_in_store(name, cfg, shared):
    config = cfg(shared=shared) if cfg else HybridConfig(suffix=SuffixConfig(shared=shared),
                                                         recycle=RecycleConfig(seed_from_prompt=False))
    p = make_proposer(name, config=config)
    other = p.init_state(SeqState(0, [9, 8, 7, 6, 5], 5))
    p.end(other)  # it finished: its text enters the store if there is one
    mine = p.init_state(SeqState(1, [1, 2, 9, 8], 4))
    tree = p.propose([mine], [Budget(max_depth=4)], ctx())[0]
    assert (7 in tree.tokens[1:]) == shared


@pytest.mark.parametrize("name", ["suffix", "hybrid"])
def test_a_store_given_outlives_its_proposer(name):
    """make_proposer(store=...): a store kept beyond one proposer (a serving engine's, a
    benchmark run's): what one proposer finished, a later one drafts from; without it, not."""
    from decoding.suffix import SuffixStore
    from decoding.tree import STORE, SUFFIX

    store = SuffixStore(24, 1 << 20)
    first = make_proposer(name, store=store)
    first.end(first.init_state(SeqState(0, [9, 8, 7, 6, 5], 5)))
    for p, sees in ((make_proposer(name, store=store), True), (make_proposer(name), False)):
        mine = p.init_state(SeqState(1, [1, 2, 9, 8], 4))
        tree = p.propose([mine], [Budget(max_depth=4)], ctx())[0]
        assert (7 in tree.tokens[1:]) == sees
        # the store's nodes are keyed apart from the sequence's own trie: the planner learns each
        assert bool(p.sources & STORE) == sees
        if sees:
            assert tree.sources[tree.tokens.index(7)] & (STORE | SUFFIX) == STORE


def test_a_store_is_refused_where_it_cannot_serve():
    from decoding.suffix import SuffixStore

    store = SuffixStore(24, 1 << 20)
    with pytest.raises(ValueError, match="store: method 'pld' drafts from no store"):
        make_proposer("pld", store=store)
    with pytest.raises(ValueError, match=r"store indexes substrings of 24 tokens, the config 16"):
        make_proposer("suffix", config=SuffixConfig(depth=16), store=store)
    with pytest.raises(ValueError, match="store must be a SuffixStore"):
        make_proposer("hybrid", store=[1, 2, 3])
    # the benchmark's path (bench/run.py --shared-store) refuses the same, the draft model's pld included
    from types import SimpleNamespace

    from decoding.options import build_proposer

    args = SimpleNamespace(pld_nk=(3, 10), lookahead_wng=(7, 5, 7), pld_candidates=4)
    for name in ("pld", "lookahead+pld", "draft+pld"):
        with pytest.raises(ValueError, match=re.escape(f"store: method '{name}' drafts from no store")):
            build_proposer(name, args, draft_model=object(), store=store)
    assert build_proposer("hybrid", args, store=store).store is store


@pytest.mark.parametrize("name", ["suffix", "hybrid"])
def test_a_store_that_holds_the_answer_drafts_it_losslessly(tiny_torch, name):
    """End to end: a store holding a prompt's greedy continuation (an earlier request's) lets
    the same prompt finish in far fewer forwards, with the same tokens."""
    from decoding.suffix import SuffixStore

    prompt = [11, 23, 5, 42, 17, 3]
    ref = generate(tiny_torch, [prompt], max_new_tokens=24, eos_token_ids=())[0]
    alone = generate(tiny_torch, [prompt], make_proposer(name), max_new_tokens=24, eos_token_ids=())[0]
    store = SuffixStore(24, 1 << 20)
    store.add(prompt + ref.output_ids)
    seen = generate(tiny_torch, [prompt], make_proposer(name, store=store), max_new_tokens=24, eos_token_ids=())[0]
    assert alone.output_ids == ref.output_ids and seen.output_ids == ref.output_ids
    assert seen.stats.forwards <= 3 < alone.stats.forwards  # measured: 2 against 9 (hybrid) and 18 (suffix)


def test_recycled_predictions_stay_with_their_sequence():
    p = make_proposer("recycle", config=RecycleConfig(seed_from_prompt=False))
    a, b = p.init_state(SeqState(0, [1, 2], 2)), p.init_state(SeqState(1, [3, 2], 2))
    a.table[2] = [5, 6]
    assert p.propose([b], [Budget(max_depth=3)], ctx())[0].tokens == [2]
    shared = make_proposer("recycle", config=RecycleConfig(seed_from_prompt=False, shared=True))
    a, b = shared.init_state(SeqState(0, [1, 2], 2)), shared.init_state(SeqState(1, [3, 2], 2))
    a.table[2] = [5, 6]
    assert shared.propose([b], [Budget(max_depth=1)], ctx())[0].tokens[1:] == [5, 6]


def test_hybrid_grows_a_narrower_recycled_tree_for_a_planner():
    """Budget.planned: hybrid grows its recycled tree with planned_recycle_widths (a planner takes
    few of a wide fringe), and with recycle.widths for full trees (--no-plan). Exact trees."""
    from decoding.tree import RECYCLE

    cfg = HybridConfig(recycle=RecycleConfig(seed_from_prompt=False, widths=(3, 2)), planned_recycle_widths=(2, 1))
    p = make_proposer("hybrid", config=cfg)
    s = p.init_state(SeqState(0, [1, 2], 2))
    s.table.update({2: [5, 6, 7], 5: [8, 9], 6: [10, 11], 7: [12]})

    def recycled(tree):  # (token, its parent's token) of every recycled node, in tree order
        return [(tok, tree.tokens[tree.parents[n]]) for n, tok in enumerate(tree.tokens) if tree.sources[n] & RECYCLE]

    full = p.propose([s], [Budget(max_depth=4)], ctx())[0]
    assert recycled(full) == [(5, 2), (6, 2), (7, 2), (8, 5), (9, 5), (10, 6), (11, 6), (12, 7)]
    planned = p.propose([s], [Budget(max_depth=4, planned=True)], ctx())[0]
    assert recycled(planned) == [(5, 2), (6, 2), (8, 5), (10, 6)]
    with pytest.raises(ValueError, match=r"planned_recycle_widths must be .* recycle.top_k=8\], got \(9,\)"):
        HybridConfig(planned_recycle_widths=(9,))
    # the default planned tree is (2, 1) (chosen with both machine states emulated, docs/DESIGN.md):
    # two recycled children of the root, one under each, nothing deeper
    d = make_proposer("hybrid", config=HybridConfig(recycle=RecycleConfig(seed_from_prompt=False)))
    sd = d.init_state(SeqState(0, [1, 2], 2))
    sd.table.update({2: [5, 6, 7], 5: [8, 9], 6: [10, 11], 8: [13], 10: [14]})
    assert recycled(d.propose([sd], [Budget(max_depth=4, planned=True)], ctx())[0]) == [(5, 2), (6, 2), (8, 5), (10, 6)]


def test_hybrid_grows_its_own_suffix_continuations_first():
    """Hybrid's trie, exact: the suffix trie's continuations come first among their siblings
    (rank 0 = its most frequent one), then prompt lookup's and the pool's copies (merged where
    they meet), recycled predictions last."""
    from decoding.tree import PLD, POOL, RECYCLE, SUFFIX

    cfg = HybridConfig(lookahead=LookaheadConfig(window=2, ngram=3, guesses=2, pool_from_prompt=False,
                                                 pld=PromptLookupConfig(max_ngram=1, num_draft=2)),
                       recycle=RecycleConfig(seed_from_prompt=False))
    p = make_proposer("hybrid", config=cfg)
    # after 7: 9 4 once (prompt lookup copies this, the first match), 8 twice (the suffix trie's top)
    s = p.init_state(SeqState(0, [7, 9, 4, 7, 8, 5, 7, 8, 6, 7], 10))
    s.pool.add((7, 3, 3), POOL)
    s.table[7] = [3, 8]
    tree = p.propose([s], [Budget(max_depth=2)], ctx())[0]
    cand = [n for n in range(1, len(tree.tokens)) if tree.candidate[n]]
    got = [(tree.tokens[n], tree.tokens[tree.parents[n]], tree.sources[n]) for n in cand]
    # after 7 8: 5 and 6 once each, the later one (6) first
    assert got == [(8, 7, SUFFIX | RECYCLE), (9, 7, SUFFIX | PLD), (6, 8, SUFFIX), (5, 8, SUFFIX),
                   (4, 9, SUFFIX | PLD), (3, 7, POOL | RECYCLE), (3, 3, POOL)]


@pytest.mark.parametrize("screen", ["on", "off"])
@pytest.mark.parametrize("name", ["lookahead+pld", "hybrid", "recycle"])
def test_a_greedy_step_reduces_its_logits_rows_once(tiny_torch, monkeypatch, name, screen):
    """verify's argmax, the lookahead window's argmax and the recycled table's top-k all come
    from one pass over a step's rows (the top-k's first index is the argmax): the LM head's
    screen where the build has one, else one reduction of the logits; and what update reads
    equals torch's answers on the same rows' logits."""
    import importlib

    from kernels import rows as logit_rows
    from kernels import skinny
    from models.runner import logits_tensor
    if screen == "on" and not skinny.head_available():
        pytest.skip(f"no LM head screen in this build: {skinny.unavailable_reason() or 'no AVX512-BF16'}")
    monkeypatch.setenv("SPECDEC_HEAD_SCREEN", "1" if screen == "on" else "0")
    calls = {"argmax_rows": 0, "argmax_topk_rows": 0, "head_topk": 0}

    def counted(key, src):
        def f(*a, **k):
            calls[key] += 1
            return getattr(src, key)(*a, **k)
        return f
    for name_ in ("decoding.generate", "decoding.proposer", "decoding.verify", "models.runner"):  # where imported
        mod = importlib.import_module(name_)  # (the package exports a function named generate)
        for key in ("argmax_rows", "argmax_topk_rows"):
            if hasattr(mod, key):
                monkeypatch.setattr(mod, key, counted(key, logit_rows))
    head_topk = skinny.head_topk
    monkeypatch.setattr(skinny, "head_topk", lambda *a, **k: (calls.__setitem__("head_topk", calls["head_topk"] + 1),
                                                             head_topk(*a, **k))[1])
    recycle = importlib.import_module("decoding.recycle")
    assert not hasattr(recycle, "topk_rows")  # no separate top-k pass
    seen = []
    learn = recycle.learn_from

    def check(table, outcome, top_k):
        rows, logits = list(outcome.rows.values()), logits_tensor(outcome.logits)
        seen.append(outcome.top_rows(top_k) == logits.topk(top_k, dim=-1).indices.tolist()
                    and outcome.argmax(list(outcome.rows)) == [int(logits[r].argmax()) for r in rows])
        learn(table, outcome, top_k)
    if name == "hybrid":  # its update calls the compiled table itself: checked as the update begins
        hybrid = importlib.import_module("decoding.hybrid").Hybrid
        update = hybrid.update

        def checked(self, state, outcome):
            check({}, outcome, self.hcfg.recycle.top_k)
            update(self, state, outcome)
        monkeypatch.setattr(hybrid, "update", checked)
    else:
        monkeypatch.setattr(recycle, "learn_from", check)
    res = generate(tiny_torch, TINY_PROMPTS[:1], make_proposer(name), max_new_tokens=12, eos_token_ids=())
    steps = res[0].stats.forwards
    if screen == "on":
        assert calls == {"argmax_rows": 0, "argmax_topk_rows": 0, "head_topk": steps}
    elif name == "lookahead+pld":
        assert calls == {"argmax_rows": steps, "argmax_topk_rows": 0, "head_topk": 0}
    else:
        assert calls == {"argmax_rows": 0, "argmax_topk_rows": steps, "head_topk": 0}
    if name != "lookahead+pld":
        assert seen == [True] * steps


def test_a_verify_override_gets_top1_always(tiny_torch):
    """One calling convention: ``verify`` always gets ``top1=`` (the rows' argmax when greedy,
    None when sampling); an override that reduces the rows itself, ignoring it, stays lossless,
    and one written without the argument is a TypeError, not silently called another way."""
    from decoding.lookahead import LookaheadPLD

    class Own(LookaheadPLD):
        seen: list = []

        def verify(self, state, tree, logits, rows, sampling, *, top1=None):
            Own.seen.append(top1 is not None)
            return super().verify(state, tree, logits, rows, sampling)  # reduces the rows itself
    ref = [generate(tiny_torch, [p], max_new_tokens=12, eos_token_ids=())[0].output_ids for p in TINY_PROMPTS]
    res = generate(tiny_torch, TINY_PROMPTS, Own(), max_new_tokens=12, eos_token_ids=())
    assert [r.output_ids for r in res] == ref and Own.seen and all(Own.seen)

    class Old(LookaheadPLD):
        def verify(self, state, tree, logits, rows, sampling):
            return super().verify(state, tree, logits, rows, sampling)
    with pytest.raises(TypeError, match="top1"):
        generate(tiny_torch, TINY_PROMPTS[:1], Old(), max_new_tokens=4, eos_token_ids=())


@pytest.mark.parametrize("name", ["ar", "hybrid", "lookahead+pld"])
def test_greedy_outputs_are_the_same_with_and_without_the_head_screen(tiny_torch, monkeypatch, name):
    """The LM head's bf16 screen answers greedy steps without the logits: the same tokens as the
    logits multiplied out, and a step's lazily multiplied-out logits are the head's own."""
    from kernels import skinny
    from models.runner import ModelRunner, StepInput, StepLogits
    if not skinny.head_available():
        pytest.skip("no LM head screen in this build (needs AVX512-BF16)")
    out = {}
    for screen in ("0", "1"):
        monkeypatch.setenv("SPECDEC_HEAD_SCREEN", screen)
        res = generate(tiny_torch, TINY_PROMPTS, make_proposer(name), max_new_tokens=16, eos_token_ids=())
        out[screen] = [r.output_ids for r in res]
    assert out["0"] == out["1"]
    runner = ModelRunner(tiny_torch, cache_tokens=64)
    runner.add_sequence(0)
    step = StepInput(0, [3, 4, 5, 6], parents=[-1, 0, 0, 1])
    full = runner.step([step])[0]
    (lg, top1, topk), = runner.step_greedy([step], k=3)
    assert isinstance(lg, StepLogits) and lg.shape == full.shape
    assert torch.equal(lg.tensor(), full)
    assert top1 == full.argmax(-1).tolist() and topk == full.topk(3, -1).indices.tolist()


@pytest.mark.parametrize("k", [1, 3])
def test_step_greedy_without_the_screen_reduces_the_whole_step_once(tiny_torch, monkeypatch, k):
    """Without the head screen a greedy step reduces every input's rows in one call (one read
    back per step on a GPU): each input gets its own rows' argmax and top-k, empty inputs
    included, as its logits give them."""
    from models import runner as runner_mod
    from models.runner import ModelRunner, StepInput
    monkeypatch.setenv("SPECDEC_HEAD_SCREEN", "0")
    calls = []
    for key in ("argmax_rows", "argmax_topk_rows"):
        real = getattr(runner_mod, key)
        monkeypatch.setattr(runner_mod, key, lambda *a, _f=real, **kw: (calls.append(1), _f(*a, **kw))[1])
    runner = ModelRunner(tiny_torch, cache_tokens=256)
    for s in range(4):
        runner.add_sequence(s)
    step = [StepInput(0, [3, 4, 5, 6], parents=[-1, 0, 0, 1]), StepInput(1, [7], logits_rows=[]),
            StepInput(2, [8, 9]), StepInput(3, [1, 2, 3], logits_rows=[2, 0])]
    got = runner.step_greedy(step, k=k)
    assert len(calls) == 1
    again = runner.step(step)  # the same slots rewritten: each input's own rows, sliced when asked
    for (lg, top1, topk), inp, ref in zip(got, step, again):
        full = lg.tensor()
        assert full.shape[0] == len(inp.tokens if inp.logits_rows is None else inp.logits_rows)
        assert lg.shape == ref.shape and torch.equal(full, ref) and lg.tensor() is full
        assert top1 == full.argmax(-1).tolist()
        assert topk == (None if k == 1 else full.topk(k, -1).indices.tolist())


def test_step_greedy_rows_the_screen_hands_back_and_bad_k(tiny_torch, monkeypatch):
    """A row the screen leaves to the caller (not finite) gets torch's answer from its own logits;
    a k below 0 is named before anything runs."""
    from kernels import skinny
    from models.runner import ModelRunner, StepInput
    runner = ModelRunner(tiny_torch, cache_tokens=64)
    runner.add_sequence(0)
    step = StepInput(0, [3, 4, 5], parents=[-1, 0, 0])
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        runner.step_greedy([step], k=-1)
    if not skinny.head_available():
        pytest.skip("no LM head screen in this build (needs AVX512-BF16)")
    full = runner.step([step])[0]
    real = skinny.head_topk
    monkeypatch.setattr(skinny, "head_topk", lambda h, s, k: (torch.zeros(h.shape[0], k, dtype=torch.int64), [1]))
    (_, top1, topk), = runner.step_greedy([step], k=2)
    assert top1[1] == int(full[1].argmax()) and topk[1] == full[1].topk(2).indices.tolist()
    assert top1[0] == 0 and top1[2] == 0  # the other rows: what the screen said
    monkeypatch.setattr(skinny, "head_topk", real)


class _Oracle(Proposer):
    """Proposes root -> (a wrong token, node 1) and root -> answer[0] -> answer[1] (nodes 2, 3);
    records what each update is told."""

    def __init__(self, answer: list[int], vocab: int):
        self.answer, self.vocab, self.seen = answer, vocab, []

    def propose(self, states, budgets, ctx):
        st = states[0]
        done = len(st.tokens) - st.prompt_len
        nxt = self.answer[done:done + 2]
        t = StepTree.root(st.root)
        if len(nxt) == 2 and budgets[0].max_depth >= 2:
            t.add_chain([(nxt[0] + 1) % self.vocab], PLD)
            t.add_chain(nxt, PLD)
        return [t]

    def update(self, state, outcome):
        self.seen.append((len(outcome.tree), outcome.path, sorted(outcome.rows), outcome.new_tokens,
                          [outcome.tree.tokens[n] for n in outcome.path[1:]]))


class _OracleOwnVerify(_Oracle):
    def verify(self, *args, **kwargs):  # the common rule, through a proposer's own entry
        return super().verify(*args, **kwargs)


@pytest.mark.parametrize("verify", ["common", "own"])
def test_a_planned_subtree_outcome_names_the_proposers_nodes(tiny_torch, verify):
    """A planner that drops a node: the outcome's path and rows are the proposed tree's node ids
    (what the proposer and the planner learn from), and the tokens are the sent tree's, on the
    loop's own greedy walk and on a proposer's own ``verify``."""
    from decoding.planner import Planner, PlannerConfig
    from models.cost import StepCost

    prompt = [5, 6, 7, 8, 5, 6, 7, 9]
    answer = generate(tiny_torch, [prompt], max_new_tokens=12, eos_token_ids=())[0].output_ids

    class Drop(Planner):
        def select(self, sids, trees):
            return [[n for n in range(len(t)) if n != 1] for t in trees]

    prop = (_Oracle if verify == "common" else _OracleOwnVerify)(answer[1:], tiny_torch.cfg.vocab_size)
    cost = StepCost(tokens=[1, 64], ms=[10.0, 10.0], per_seq_ms=0.0, context=16)
    res = generate(tiny_torch, [prompt], prop, max_new_tokens=12, eos_token_ids=(),
                   planner=Drop(cost, PlannerConfig(learn_overhead=False)))
    assert res[0].output_ids == answer
    three = [s for s in prop.seen if s[0] == 4]
    assert three, "no step proposed the three-node tree"
    for size, path, rows, new, drafted in three:
        assert path[:3] == [0, 2, 3][:len(path)] and 1 not in rows and rows == [0, 2, 3]
        assert new[:len(drafted)] == drafted


def test_a_verify_or_update_set_on_the_proposer_object_is_called(tiny_torch):
    """The loop skips the base class's no-op ``update`` and walks the common greedy rule itself, but
    a ``verify`` or ``update`` put on the object (a wrapper, a spy) is called as a subclass's is."""
    calls = {"verify": 0, "update": 0}
    prop = make_proposer("pld")
    base_verify = prop.verify

    def verify(*args, **kwargs):
        calls["verify"] += 1
        return base_verify(*args, **kwargs)

    def update(state, outcome):
        calls["update"] += 1

    prop.verify, prop.update = verify, update
    res = generate(tiny_torch, TINY_PROMPTS[:1], prop, max_new_tokens=6, eos_token_ids=())
    steps = res[0].stats.forwards
    assert steps > 0 and calls == {"verify": steps, "update": steps}
