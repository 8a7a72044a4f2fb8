"""The compiled drafting (decoding/compiled_draft.py) against the Python reference, method by
method: the same trees at every step, the same outputs, the same learnt state.

The components (the suffix trie, the pool, the recycled table, the prompt-lookup search) are
held equal to their references in tests/test_compiled_suffix.py and test_compiled_tables.py;
here whole methods run on both paths over an oracle (bench/host_step.py's OracleRunner, which
knows each sequence's answer) on synthetic texts that repeat themselves, so that drafts are
accepted, rejected, merged and cut by budgets and by the planner.
"""

import random
from dataclasses import fields
from typing import Optional

import pytest

from bench.host_step import DEFAULT_COST, OracleRunner
from decoding import compiled, compiled_draft, generate, make_proposer
from decoding.hybrid import HybridConfig
from decoding.lookahead import LookaheadConfig
from decoding.planner import Planner, PlannerConfig
from decoding.recycle import RecycleConfig
from decoding.suffix import SuffixConfig, SuffixStore
from decoding.tree import StepTree
from models.cost import load_step_cost
from tests.helpers import ours_from_hf, tiny_hf_model

pytestmark = pytest.mark.skipif(not compiled_draft.LIBRARY.get(), reason="no C compiler: the reference runs")

METHODS = ("pld", "suffix", "recycle", "lookahead", "lookahead+pld", "hybrid")
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def tiny():
    return ours_from_hf(tiny_hf_model("llama", seed=5)).model


def texts(seed: int, n: int, vocab: int = 97) -> tuple[list[list[int]], list[list[int]]]:
    """n prompts and their answers (prompt + NEW_TOKENS): pieces copied from the prompt or from
    the answer so far, with a few fresh tokens, so that every source finds something."""
    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(n):
        base = [rng.randrange(vocab) for _ in range(rng.randrange(8, 20))]
        prompt = base + [t if rng.random() < 0.8 else rng.randrange(vocab) for t in base] + base[:rng.randrange(1, 6)]
        text = list(prompt)
        while len(text) < len(prompt) + NEW_TOKENS:
            if rng.random() < 0.7:
                i = rng.randrange(len(text) - 3)
                text += text[i:i + rng.randrange(2, 9)]
            else:
                text.append(rng.randrange(vocab))
        prompts.append(prompt)
        answers.append(text[:len(prompt) + NEW_TOKENS])
    return prompts, answers


def snapshot(tree: StepTree) -> tuple:
    return tuple(tuple(getattr(tree, f.name)) if f.name != "children" else tuple(map(tuple, map(dict.items,
                                                                                               tree.children)))
                 for f in fields(StepTree)) + (tuple(sorted(tree.extra_logits)),)


def run(model, name: str, prompts, answers, on: bool, plan: bool, config=None, store=None, batch: int = 3,
        one_call: Optional[bool] = None):
    """Every proposed tree (snapshots, in order) and the outputs of ``name`` on one path
    (``one_call``: a lookahead-family proposer's drafting in one call or call by call)."""
    before = compiled.use_compiled(on)
    try:
        proposer = make_proposer(name, config=config, store=store)
        if one_call is not None:
            proposer.one_call = one_call
        assert (getattr(proposer, "buf", None) is not None) == on, "the path the switch names"
        log = []
        propose = proposer.propose

        def traced(states, budgets, ctx):
            trees = propose(states, budgets, ctx)
            log.append([snapshot(t) for t in trees])
            return trees

        proposer.propose = traced
        outputs = []
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            runner = OracleRunner(model, dict(enumerate(answers[i:i + batch])), cache_tokens=4096, block_size=4)
            planner = Planner(load_step_cost(DEFAULT_COST), PlannerConfig(learn_overhead=False)) if plan else None
            if planner is not None:  # what each step sends, beside what was proposed
                planner.select = sending(planner.select, log)
            out = generate(model, chunk, proposer, max_new_tokens=NEW_TOKENS, planner=planner, runner=runner,
                           eos_token_ids=())  # the synthetic texts hold any token
            outputs += [list(p) + r.output_ids for p, r in zip(chunk, out)]
        return log, outputs
    finally:
        compiled.use_compiled(before)


def sending(select, log: list):
    """``Planner.select`` that also logs what it keeps."""
    def logged(sids, trees):
        keep = select(sids, trees)
        log.append(("sent", keep))
        return keep
    return logged


@pytest.mark.parametrize("plan", [False, True], ids=["whole", "planned"])
@pytest.mark.parametrize("name", METHODS)
def test_methods_propose_the_same_trees_on_both_paths(tiny, name, plan):
    prompts, answers = texts(1, 6)
    fast = run(tiny, name, prompts, answers, True, plan)
    ref = run(tiny, name, prompts, answers, False, plan)
    assert fast[1] == ref[1] == answers  # lossless on both paths
    assert len(fast[0]) == len(ref[0])
    for step, (a, b) in enumerate(zip(*(fast[0], ref[0]))):
        assert a == b, f"{name}: step {step} differs"
    proposed = [trees for trees in ref[0] if isinstance(trees, list)]
    assert sum(len(t[0]) for trees in proposed for t in trees) > 2 * len(proposed), "drafts were proposed"


@pytest.mark.parametrize("name,config", [
    ("suffix", SuffixConfig(depth=6, max_match=3, max_nodes=5, min_prob=0.2)),
    ("recycle", RecycleConfig(top_k=3, widths=(3, 2, 1), max_nodes=7, shared=True, seed_from_prompt=True)),
    ("lookahead", LookaheadConfig(window=3, ngram=3, guesses=2, max_verify=6)),
    ("lookahead+pld", LookaheadConfig(window=4, ngram=2, guesses=3, max_verify=9)),
    ("hybrid", HybridConfig(lookahead=LookaheadConfig(window=3, ngram=4, guesses=2, max_verify=8),
                            recycle=RecycleConfig(top_k=4, widths=(4, 1), shared=True),
                            suffix=SuffixConfig(depth=8, max_match=4, min_prob=0.1), max_nodes=12)),
])
def test_small_configs_cut_the_same_trees(tiny, name, config):
    prompts, answers = texts(2, 5)
    for plan in (False, True):
        fast = run(tiny, name, prompts, answers, True, plan, config=config, batch=2)
        ref = run(tiny, name, prompts, answers, False, plan, config=config, batch=2)
        assert fast == ref and fast[1] == answers


@pytest.mark.parametrize("name", ["suffix", "hybrid"])
def test_a_shared_store_drafts_the_same_on_both_paths(tiny, name):
    prompts, answers = texts(3, 6)
    cfg = SuffixConfig(store_nodes=3000)
    runs = []
    for on in (True, False):
        before = compiled.use_compiled(on)
        try:
            store = SuffixStore(cfg.depth, cfg.store_nodes)
        finally:
            compiled.use_compiled(before)
        # two calls: the second drafts from what the first finished
        runs.append([run(tiny, name, prompts[:3], answers[:3], on, True, store=store),
                     run(tiny, name, prompts[3:], answers[3:], on, True, store=store), store.trie.size])
    assert runs[0] == runs[1]


def test_a_reference_store_keeps_its_proposers_on_the_reference():
    before = compiled.use_compiled(False)
    try:
        store = SuffixStore(24, 1000)
    finally:
        compiled.use_compiled(before)
    assert make_proposer("hybrid", store=store).buf is None
    assert make_proposer("suffix", store=store).buf is None


def test_lookup_states_searches_the_c_histories_as_the_host_search():
    """prompt_lookup.lookup_states with the histories in C (DraftPLD's search on the compiled path)
    against the reference search, on histories that grow between calls."""
    import random

    from decoding.prompt_lookup import HostHistories, PromptLookupConfig, lookup_states
    from decoding.proposer import SeqState
    from kernels.backend import get_backend

    rng = random.Random(4)
    states = [SeqState(i, [rng.randrange(6) for _ in range(rng.randrange(1, 40))], 1) for i in range(4)]
    host, backend = HostHistories(), get_backend("torch")
    for cfg in (PromptLookupConfig(), PromptLookupConfig(num_candidates=4, prefer="recent", max_ngram=4),
                PromptLookupConfig(partial=False, min_ngram=2)):
        for _ in range(6):
            for s in states:
                s.tokens += [rng.randrange(6) for _ in range(rng.randrange(0, 4))]
            assert lookup_states(backend, states, cfg, host=host) == lookup_states(backend, states, cfg)


def test_a_built_tree_grown_in_python_drops_its_c_arrays():
    """BuiltTree: its children made node by node equal the dicts a StepTree holds; grown through
    its methods it becomes a plain tree (children dicts, no ``flat``), so the planner's C reads
    its lists, not the arrays it was built with."""
    from decoding.compiled import PlannerCore
    from decoding.tree import PLD, POOL, WINDOW

    buf, ref_w = compiled_draft.TreeBuf(4), StepTree.root(9)
    buf.start(9, 64)  # grows the buffers
    for chain, src in (([1, 2, 3], PLD), ([1, 4], POOL), ([5], PLD)):
        buf.add_chain(chain, src, 100)
        ref_w.add_chain(chain, src)
    buf.add_window([[9, 7], [0, 8]], WINDOW)  # the trunk (7, column 1), then each column's level below
    top = ref_w.add_private_chain(0, [7], WINDOW, group=1)
    ref_w.add_private_chain(0, [0], WINDOW, group=0)
    ref_w.add_private_chain(top[-1], [8], WINDOW, group=1)
    tree = buf.step_tree()
    assert tree == ref_w and tree.flat is not None
    assert tree.children[-1] == {} and tree.children[1] == {2: 2, 4: 4} and tree.children[0:2] == ref_w.children[0:2]
    with pytest.raises(IndexError):
        tree.children[len(tree)]
    flat = PlannerCore.flatten(None, [tree])
    assert [a.tolist() for a in flat[2:]] == [a.tolist() for a in PlannerCore.flatten(None, [ref_w])[2:]]
    tree.add_chain([1, 6], POOL)  # a merge into node 1 and a new node
    ref_w.add_chain([1, 6], POOL)
    assert tree.flat is None and isinstance(tree.children, list) and tree == ref_w
    assert [a.tolist() for a in PlannerCore.flatten(None, [tree])[2:]] == \
        [a.tolist() for a in PlannerCore.flatten(None, [ref_w])[2:]]


def test_host_histories_mirror_again_a_list_that_is_not_the_one_they_saw():
    from decoding.prompt_lookup import HostHistories
    from decoding.proposer import SeqState

    host, s = HostHistories(), SeqState(0, [1, 2, 3, 1, 2], 1)
    assert len(host.of(s)) == 5
    s.tokens.append(3)
    assert len(host.of(s)) == 6  # grown: the new token appended
    s.tokens[:] = [4, 5, 4]  # another list under the same state: searched afresh
    hist = host.of(s)
    assert len(hist) == 3 and hist.search(min_n=1, max_n=2, k=2) == [[5, 4]]


@pytest.mark.parametrize("glue", [True, False], ids=["c-glue", "python-glue"])
@pytest.mark.parametrize("name", ["lookahead", "lookahead+pld", "hybrid"])
def test_one_call_drafts_the_trees_of_the_calls_one_by_one(tiny, name, glue):
    """Lookahead.propose_compiled drafting a sequence in one call (draft.c, through the C glue or
    ctypes) against the same proposer composing its parts call by call: the same trees and
    outputs, whole and planned, with the default configuration and a small one."""
    if glue and compiled.glue() is None:
        pytest.skip(f"the C glue did not build: {compiled.EXT.reason}")
    small = {"lookahead": LookaheadConfig(window=3, ngram=3, guesses=2, max_verify=6),
             "lookahead+pld": LookaheadConfig(window=4, ngram=2, guesses=3, max_verify=9),
             "hybrid": HybridConfig(lookahead=LookaheadConfig(window=3, ngram=4, guesses=2, max_verify=8),
                                    recycle=RecycleConfig(top_k=4, widths=(4, 1), shared=True),
                                    suffix=SuffixConfig(depth=8, max_match=4, min_prob=0.1), max_nodes=12)}[name]
    prompts, answers = texts(5, 4)
    calls = {"draft": 0}
    draft = compiled_draft.TreeBuf.draft

    def counted(self, *a, **k):
        calls["draft"] += 1
        return draft(self, *a, **k)

    before = compiled.use_extension(glue)
    try:
        compiled_draft.TreeBuf.draft = counted
        for config in (None, small):
            for plan in (False, True):
                one = run(tiny, name, prompts, answers, True, plan, config=config, batch=2, one_call=True)
                assert calls["draft"] > 0
                calls["draft"] = 0
                by_call = run(tiny, name, prompts, answers, True, plan, config=config, batch=2, one_call=False)
                assert calls["draft"] == 0
                assert one == by_call and one[1] == answers
    finally:
        compiled_draft.TreeBuf.draft = draft
        compiled.use_extension(before)


def test_a_subclass_with_a_hook_of_its_own_is_drafted_call_by_call(tiny):
    """A subclass that grows its compiled trees with a hook of its own (not compiled_sources) is
    drafted call by call, its hook called; the built-in classes draft in one call."""
    from decoding.lookahead import LookaheadPLD

    class Marked(LookaheadPLD):
        seen = 0

        def last_compiled(self, state, budget):
            Marked.seen += 1

    assert make_proposer("hybrid").one_call and make_proposer("lookahead").one_call
    proposer = Marked()
    assert not proposer.one_call
    prompts, answers = texts(6, 2)
    runner = OracleRunner(tiny, dict(enumerate(answers)), cache_tokens=4096, block_size=4)
    out = generate(tiny, prompts, proposer, max_new_tokens=NEW_TOKENS, runner=runner, eos_token_ids=())
    assert [list(p) + r.output_ids for p, r in zip(prompts, out)] == answers and Marked.seen > 0
