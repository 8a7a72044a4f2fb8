"""decoding/vllm.py without vLLM: the chain chosen from our tree, and the custom_class contract
driven the way vLLM's runner calls it (a fake config, rows of token contexts in a 2-D array).
Inside vLLM itself: tests/test_vllm.py (marker ``vllm``, ``make test-vllm``)."""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from decoding.tree import PLD, SUFFIX, StepTree
from decoding.vllm import (PROPOSERS, HybridProposer, PromptLookupProposer, SuffixProposer, TokenDrafter,
                           VllmDrafterConfig, best_chain)


def fake_config(k=5, max_model_len=256):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


class Rows:
    """vLLM's persistent batch as the proposer sees it: a (rows, max_model_len) int32 array and
    each row's length; a step appends what the row sampled."""

    def __init__(self, contexts, width=256):
        self.ids = np.zeros((len(contexts), width), dtype=np.int32)
        self.n = np.zeros(len(contexts), dtype=np.int32)
        for i, c in enumerate(contexts):
            self.put(i, c)

    def put(self, i, tokens):
        self.ids[i, :len(tokens)] = tokens
        self.n[i] = len(tokens)

    def append(self, i, tokens):
        self.ids[i, self.n[i]:self.n[i] + len(tokens)] = tokens
        self.n[i] += len(tokens)

    def tokens(self, i):
        return self.ids[i, :self.n[i]].tolist()


def tree_of(chains):
    t = StepTree.root(0)
    for src, chain in chains:
        t.add_chain(chain, src)
    return t


def test_imports_without_vllm():
    assert "vllm" not in sys.modules or hasattr(sys.modules["vllm"], "LLM")  # nothing here imported it
    assert set(PROPOSERS) == {"pld", "suffix", "hybrid", "mix"}


def test_best_chain_takes_the_most_expected_tokens():
    # root -> a(0.5) -> b(0.45) ; root -> c(0.4) -> d(0.35) -> e(0.3): 0.95 against 1.05
    t = tree_of([(PLD, [1, 2]), (SUFFIX, [3, 4, 5])])
    probs = [1.0, 0.5, 0.45, 0.4, 0.35, 0.3]
    assert best_chain(t, probs, 5) == [3, 4, 5]
    assert best_chain(t, probs, 2) == [1, 2]  # cut at two nodes the first branch is worth more
    assert best_chain(t, probs, 5, min_chance=0.32) == [1, 2]  # e dropped: c, d alone are 0.75
    assert best_chain(t, probs, 0) == []
    assert best_chain(t, probs, 5, min_chance=0.6) == []


def test_best_chain_ties_go_to_the_higher_ranked_sibling():
    t = tree_of([(PLD, [1]), (SUFFIX, [2])])
    assert best_chain(t, [1.0, 0.3, 0.3], 3) == [1]
    with pytest.raises(ValueError, match="max_len must be >= 0"):
        best_chain(t, [1.0, 0.3, 0.3], -1)


def test_proposer_contract_drafts_the_repeated_continuation():
    p = HybridProposer(fake_config(k=3))
    p.load_model(object())  # the CPU runner calls it with the target model
    ctx = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    rows = Rows([ctx])
    out = p.propose([[6]], rows.n, rows.ids)
    assert out == [[7, 8, 9]]  # at most num_speculative_tokens
    assert p.stats["drafts"] == 1 and p.stats["requests"] == 1


def test_no_draft_for_rows_without_sampled_tokens_or_room():
    p = PromptLookupProposer(fake_config(k=4, max_model_len=11))
    rows = Rows([[1, 2, 3, 1, 2], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    out = p.propose([[], [2]], rows.n, rows.ids)
    assert out[0] == []  # a prefill still in chunks
    assert out[1] == [3]  # one position left before max_model_len


def test_a_chain_below_the_bar_still_sends_its_first_node():
    # no estimate reaches min_chance 0.99: the best first node goes alone, so acceptance is
    # still learned (sending nothing would leave the estimates where they are for good)
    d = TokenDrafter(VllmDrafterConfig(drafter="pld", min_chance=0.99), num_speculative_tokens=3, max_model_len=64)
    rows = Rows([[1, 2, 3, 4, 9, 1, 2]])
    assert d.propose_rows([[2]], rows.n, rows.ids) == [[3]]
    rows.append(0, [3, 4])  # accepted, then the target's own token
    d.propose_rows([[3, 4]], rows.n, rows.ids)
    assert d.stats["accepted"] == 1
    # nothing in the tree: still nothing sent
    d = TokenDrafter(VllmDrafterConfig(drafter="pld", min_chance=0.99), num_speculative_tokens=3, max_model_len=64)
    rows = Rows([[1, 2, 3, 4]])
    assert d.propose_rows([[4]], rows.n, rows.ids) == [[]]


def test_acceptance_is_learned_from_the_next_call():
    p = PromptLookupProposer(fake_config(k=3))
    rows = Rows([[1, 2, 3, 4, 9, 1, 2]])
    assert p.propose([[2]], rows.n, rows.ids) == [[3, 4, 9]]
    rows.append(0, [3, 4, 7])  # two drafts accepted, then the target's own token
    p.propose([[3, 4, 7]], rows.n, rows.ids)
    assert p.stats["accepted"] == 2
    acc = p.drafter_impl.live[0].acc
    hits = sum(acc.hits.values())
    trials = sum(acc.trials.values())
    assert hits == pytest.approx(2.0) and trials == pytest.approx(3.0)  # depth 3 was tried and missed
    assert acc.streak


def test_requests_are_followed_when_rows_move_and_retired_when_gone():
    p = SuffixProposer(fake_config(k=4))
    a, b = [1, 2, 3, 1, 2], [7, 8, 9, 7, 8]
    rows = Rows([a, b])
    p.propose([[2], [8]], rows.n, rows.ids)
    rows.append(0, [3])
    rows.append(1, [9])
    swapped = Rows([rows.tokens(1), rows.tokens(0)])  # vLLM condensed the batch: rows changed places
    p.propose([[9], [3]], swapped.n, swapped.ids)
    assert p.stats["requests"] == 2
    # request a finishes; a new request repeats its text: the shared store drafts a's continuation
    new = Rows([[4, 4, 1, 2, 3, 1, 2, 3]])
    p.propose([[3]], new.n, new.ids)
    assert p.stats["requests"] == 3
    store = p.drafter_impl.store
    assert store is not None and len(store.trie.text) > 10  # both finished requests were added


def test_the_shared_store_drafts_what_another_request_wrote():
    p = SuffixProposer(fake_config(k=4))
    first = Rows([[50, 51, 52, 53, 54, 55]])
    p.propose([[55]], first.n, first.ids)
    second = Rows([[60, 61, 52, 53]])  # the first is gone: its text is in the store
    assert p.propose([[53]], second.n, second.ids) == [[54, 55]]
    pld = PromptLookupProposer(fake_config(k=4))  # prompt lookup alone has no store
    pld.propose([[55]], first.n, first.ids)
    assert pld.propose([[53]], second.n, second.ids) == [[]]


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="needs num_speculative_tokens"):
        HybridProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=None),
                                       model_config=SimpleNamespace(max_model_len=64)))
    with pytest.raises(ValueError, match="drafter must be one of"):
        VllmDrafterConfig(drafter="eagle")
    with pytest.raises(ValueError, match="min_chance must be in"):
        VllmDrafterConfig(min_chance=1.5)
    with pytest.raises(ValueError, match="max_model_len must be an integer >= 2"):
        TokenDrafter(num_speculative_tokens=3, max_model_len=1)


def test_compare_vllm_without_its_venv_says_how_to_build_it(tmp_path):
    from bench.vllm_compare import speculative_config, vllm_python

    with pytest.raises(ValueError, match="make vllm"):
        vllm_python(tmp_path / "no-venv")
    assert speculative_config("vllm-specdec", 10, (3, 10))["model"] == "decoding.vllm.HybridProposer"
    assert speculative_config("vllm-specdec-mix", 10, (3, 10))["model"] == "decoding.vllm.MixProposer"
    assert speculative_config("vllm-ngram", 10, (3, 10))["prompt_lookup_max"] == 3
    with pytest.raises(ValueError, match="unknown vLLM method"):
        speculative_config("vllm-eagle", 10, (3, 10))


def test_the_vllm_child_runs_on_the_threads_asked_for(tmp_path, monkeypatch):
    """numba (vLLM's n-gram proposer) sets the forward's OpenMP threads to NUMBA_NUM_THREADS,
    every core by default: the child's environment pins it with OMP_NUM_THREADS, and a run
    whose thread count moved anyway is refused, not reported."""
    from bench.vllm_compare import check_threads, child_env

    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    env = child_env(1, tmp_path / "bin" / "python")
    assert env["NUMBA_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "LD_PRELOAD" not in env  # no libiomp5 in that venv
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").touch()
    assert child_env(2, tmp_path / "bin" / "python")["LD_PRELOAD"].startswith(str(tmp_path / "lib" / "libiomp5.so"))
    check_threads(1, 1)
    with pytest.raises(RuntimeError, match="torch ran on 2 threads after the runs, not the 1 asked for"):
        check_threads(1, 2)


@pytest.mark.parametrize("cls", [PromptLookupProposer, SuffixProposer, HybridProposer])
def test_the_compiled_drafting_proposes_what_the_reference_does(cls):
    """Our proposers inside vLLM on the compiled path (decoding/compiled_draft.py) and on the
    reference: the same chains at every call and the same learnt totals, over requests whose
    answers repeat their text, rows that finish and new ones that start."""
    import random

    from decoding import compiled, compiled_draft

    if compiled_draft.LIBRARY.get() is None:
        pytest.skip(f"no compiled drafting: {compiled_draft.LIBRARY.reason}")
    rng = random.Random(0)
    texts = []
    for _ in range(5):
        t = [rng.randrange(30) for _ in range(12)]
        while len(t) < 90:
            i = rng.randrange(len(t) - 3)
            t += t[i:i + rng.randrange(2, 8)] if rng.random() < 0.7 else [rng.randrange(30)]
        texts.append(t[:90])
    runs = []
    for on in (True, False):
        before = compiled.use_compiled(on)
        try:
            p = cls(fake_config(k=5))
        finally:
            compiled.use_compiled(before)
        assert (p.drafter_impl.buf is not None) == on
        log, done = [], 0
        rows = Rows([texts[0][:20], texts[1][:25]])
        owner = [0, 1]  # row -> text
        sampled = [[texts[0][19]], [texts[1][24]]]
        for _ in range(40):
            drafts = p.propose(sampled, rows.n, rows.ids)
            log.append(drafts)
            sampled = []
            for r, chain in enumerate(drafts):
                text, n = texts[owner[r]], int(rows.n[r])
                a = 0
                while a < len(chain) and n + a < len(text) and chain[a] == text[n + a]:
                    a += 1
                gained = text[n:n + a + 1]
                rows.append(r, gained)
                sampled.append(gained)
            for r in range(len(owner)):  # a finished request gives its row to the next text
                if rows.n[r] >= 80 and done < 3:
                    done += 1
                    owner[r] = 2 + done - 1
                    rows.put(r, texts[owner[r]][:15])
                    sampled[r] = [texts[owner[r]][14]]
        runs.append((log, dict(p.stats)))
    assert runs[0] == runs[1]
    assert runs[1][1]["accepted"] > 0
