"""ngram_match (Triton), ngram_match_ref and the host search ngram_match_lists: exact tables,
the prompt-lookup seed, and property tests of kernel == reference == host search over random
ragged batches."""

import os
import tempfile

import pytest
import torch

# Hypothesis caches examples and source constants under ./.hypothesis: keep them out of the tree.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "specdec-hypothesis"))
from hypothesis import given, settings, strategies as st  # noqa: E402

from kernels.backend import Backend, TorchBackend
from kernels.ngram_match import ngram_match, ngram_match_lists, ngram_match_ref


def ngram_match_host(tokens, cu_seqlens, **kw):
    """ngram_match_lists behind the tensor interface of the other two (padded with -1)."""
    cu = cu_seqlens.tolist()
    histories = [tokens[cu[b]:cu[b + 1]].tolist() for b in range(len(cu) - 1)]
    found = ngram_match_lists(histories, **kw)
    C, k = kw.get("num_candidates", 1), kw["k"]
    cands = torch.full((len(histories), C, k), -1, dtype=tokens.dtype)
    lens = torch.zeros(len(histories), C, dtype=torch.int32)
    for b, conts in enumerate(found):
        assert 0 < len(conts) <= C or not conts  # only found continuations, none empty
        for c, cont in enumerate(conts):
            assert 0 < len(cont) <= k
            cands[b, c, :len(cont)] = torch.tensor(cont, dtype=tokens.dtype)
            lens[b, c] = len(cont)
    return cands, lens


IMPLS = [ngram_match_ref, ngram_match, ngram_match_host]


def run(impl, histories, dtype=torch.int64, **kw):
    tokens = torch.tensor([t for h in histories for t in h], dtype=dtype)
    cu = torch.tensor([0] + [len(h) for h in histories]).cumsum(0).to(torch.int32)
    cands, lens = impl(tokens, cu, **kw)
    assert cands.dtype == dtype and lens.dtype == torch.int32
    assert cands.shape == (len(histories), kw.get("num_candidates", 1), kw["k"])
    # The -1 padding is part of the contract: check it, then return plain lists.
    for b in range(len(histories)):
        for c in range(cands.shape[1]):
            assert (cands[b, c, lens[b, c]:] == -1).all()
    return [[cands[b, c, :lens[b, c]].tolist() for c in range(cands.shape[1])] for b in range(len(histories))]


# (history, kwargs, expected candidates)
TABLE = [
    ([1, 2, 3, 4, 1, 2, 3], dict(min_n=1, max_n=3, k=3), [[4, 1, 2]]),
    ([], dict(min_n=1, max_n=3, k=3), [[]]),
    ([7], dict(min_n=1, max_n=3, k=3), [[]]),
    ([1, 2, 3, 4], dict(min_n=1, max_n=3, k=2), [[]]),  # no match
    ([5, 6, 7, 8, 5, 6], dict(min_n=2, max_n=2, k=2), [[7, 8]]),  # n-gram at the very start
    ([1, 2, 1, 2], dict(min_n=1, max_n=2, k=3), [[1, 2]]),  # continuation cut at the end
    ([1, 2, 1, 2], dict(min_n=1, max_n=2, k=3, partial=False), [[]]),  # the seed rule rejects it
    ([7, 7, 7, 7], dict(min_n=1, max_n=3, k=3), [[7]]),  # overlaps the tail itself
    ([1, 2, 3, 1, 2], dict(min_n=1, max_n=2, k=3, partial=False), [[3, 1, 2]]),
    ([1, 9, 1, 8, 1, 7, 1], dict(min_n=1, max_n=1, k=1), [[9]]),  # many matches: first
    ([1, 9, 1, 8, 1, 7, 1], dict(min_n=1, max_n=1, k=1, prefer="recent"), [[7]]),  # most recent
    ([1, 9, 1, 8, 1, 9, 1, 7, 1], dict(min_n=1, max_n=1, k=1, num_candidates=3), [[9], [8], [7]]),  # dup 9 skipped
    ([1, 9, 1, 8, 1, 9, 1, 7, 1], dict(min_n=1, max_n=1, k=1, num_candidates=3, prefer="recent"), [[7], [9], [8]]),
    ([1, 9, 1, 9, 1], dict(min_n=1, max_n=1, k=1, num_candidates=3), [[9], [], []]),  # fewer than asked
    # Longest n first, then shorter n adds new continuations.
    ([3, 7, 4, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3], dict(min_n=1, max_n=3, k=1, num_candidates=3), [[9], [8], [7]]),
    # A cut continuation [5, 1] and a full one [5, 6] are distinct.
    ([1, 5, 6, 1, 5, 1], dict(min_n=1, max_n=1, k=2, num_candidates=2, prefer="recent"), [[5, 1], [5, 6]]),
    # min_n = 2 ignores the single-token match.
    ([4, 5, 9, 6, 5], dict(min_n=2, max_n=3, k=2), [[]]),
    ([4, 5, 9, 6, 5], dict(min_n=1, max_n=3, k=2), [[9, 6]]),
]


@pytest.mark.parametrize("impl", IMPLS, ids=["ref", "triton", "host"])
@pytest.mark.parametrize("history, kw, expected", TABLE)
def test_exact_table(impl, history, kw, expected):
    assert run(impl, [history], **kw) == [expected]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_table_as_one_ragged_batch(dtype):
    """Every table row with the same arguments, batched, gives the same rows (kernel only)."""
    kw = dict(min_n=1, max_n=3, k=3)
    rows = [h for h, k_, _ in TABLE if k_ == kw]
    expected = [e for _, k_, e in TABLE if k_ == kw]
    assert run(ngram_match, rows, dtype=dtype, **kw) == expected


def find_candidate_pred_tokens(input_ids, max_ngram_size=3, num_pred_tokens=10):
    """The prompt-lookup seed function, verbatim."""
    input_length = input_ids.size(1)
    for ngram_size in range(max_ngram_size, 0, -1):
        ngram = input_ids[0, -ngram_size:].tolist()
        windows = input_ids.unfold(dimension=1, size=ngram_size, step=1)
        ngram_tensor = torch.tensor(ngram, device=input_ids.device).unsqueeze(0)
        matches = (windows == ngram_tensor).all(dim=2)
        match_indices = matches.nonzero(as_tuple=True)[1]
        for idx in match_indices:
            start_idx = idx + ngram_size
            end_idx = start_idx + num_pred_tokens
            if end_idx <= input_length and start_idx < input_length - ngram_size:
                return input_ids[0, start_idx:end_idx]
    return torch.tensor([], dtype=torch.long, device=input_ids.device)


def test_ref_with_seed_rule_reproduces_seed_function():
    """num_candidates=1, prefer='first', partial=False is the seed exactly. The seed needs
    L >= max_ngram_size (unfold fails otherwise); n = L never matches in either (only the
    tail's own window), so the reference's n <= L - 1 bound changes nothing."""
    g = torch.Generator().manual_seed(0)
    checked_nonempty = 0
    for trial in range(400):
        max_n = int(torch.randint(1, 5, (1,), generator=g))
        k = int(torch.randint(1, 8, (1,), generator=g))
        L = int(torch.randint(max_n, 40, (1,), generator=g))
        vocab = int(torch.randint(2, 6, (1,), generator=g))
        h = torch.randint(0, vocab, (1, L), generator=g)
        seed = find_candidate_pred_tokens(h, max_ngram_size=max_n, num_pred_tokens=k).tolist()
        cands, lens = ngram_match_ref(h[0], torch.tensor([0, L], dtype=torch.int32), min_n=1, max_n=max_n,
                                      k=k, num_candidates=1, prefer="first", partial=False)
        assert cands[0, 0, :lens[0, 0]].tolist() == seed, (h.tolist(), max_n, k)
        checked_nonempty += bool(seed)
    assert checked_nonempty > 50  # the comparison is not vacuous


def test_kernel_with_seed_rule_reproduces_seed_function():
    g = torch.Generator().manual_seed(1)
    histories, seeds = [], []
    for _ in range(24):
        L = int(torch.randint(3, 60, (1,), generator=g))
        h = torch.randint(0, 4, (1, L), generator=g)
        histories.append(h[0].tolist())
        seeds.append([find_candidate_pred_tokens(h, max_ngram_size=3, num_pred_tokens=5).tolist()])
    assert run(ngram_match, histories, min_n=1, max_n=3, k=5, partial=False) == seeds


@st.composite
def ragged_batch(draw):
    B = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 4))  # small alphabet: matches everywhere
    histories = [draw(st.lists(st.integers(0, vocab - 1), max_size=48)) for _ in range(B)]
    min_n = draw(st.integers(1, 3))
    kw = dict(min_n=min_n, max_n=draw(st.integers(min_n, 4)), k=draw(st.integers(1, 7)),
              num_candidates=draw(st.integers(1, 4)), prefer=draw(st.sampled_from(["first", "recent"])),
              partial=draw(st.booleans()))
    return histories, kw, draw(st.sampled_from([torch.int32, torch.int64]))


@settings(max_examples=150, deadline=None)
@given(ragged_batch())
def test_kernel_equals_ref_on_random_batches(case):
    histories, kw, dtype = case
    assert run(ngram_match, histories, dtype=dtype, **kw) == run(ngram_match_ref, histories, dtype=dtype, **kw)


@settings(max_examples=300, deadline=None)
@given(ragged_batch())
def test_host_search_equals_ref_on_random_batches(case):
    histories, kw, _ = case
    assert run(ngram_match_host, histories, **kw) == run(ngram_match_ref, histories, **kw)


def test_host_search_on_large_token_ids_and_byte_straddles():
    """Tokens whose int64 bytes repeat inside other tokens: a byte match that straddles two
    tokens is not a match."""
    big = [0x0101010101010101, 0x0101010101010100, 1, 256, 2 ** 62, -1]
    g = torch.Generator().manual_seed(3)
    for trial in range(300):
        L = int(torch.randint(0, 30, (1,), generator=g))
        h = [big[int(i)] for i in torch.randint(0, len(big), (L,), generator=g)]
        for kw in (dict(num_candidates=3, prefer="first"), dict(num_candidates=2, prefer="recent"),
                   dict(num_candidates=1, prefer="recent", partial=False)):
            kw.update(min_n=1, max_n=3, k=4)
            assert run(ngram_match_host, [h], **kw) == run(ngram_match_ref, [h], **kw), (h, kw)


def test_backend_list_entry_points_agree():
    """What the decoders call: the torch backend's host search and the base class's packed
    path (what the Triton backend runs) give the same lists, on a ragged batch."""
    g = torch.Generator().manual_seed(4)
    histories = [torch.randint(0, 3, (int(n),), generator=g).tolist() for n in (0, 1, 5, 40, 77)]

    class Packed(TorchBackend):  # the base class's list entry point over the reference kernel
        ngram_match_lists = Backend.ngram_match_lists

    for kw in (dict(num_candidates=1), dict(num_candidates=3, prefer="recent"), dict(num_candidates=2, partial=False)):
        kw.update(min_n=1, max_n=3, k=5)
        want = TorchBackend().ngram_match_lists(histories, **kw)
        assert Packed().ngram_match_lists(histories, **kw) == want
        assert want == [[c for c in row if c] for row in run(ngram_match_ref, histories, **kw)]
        assert any(want)


def test_long_repetitive_history_spans_blocks():
    """Matches far apart (several kernel blocks) and thousands of duplicate continuations."""
    h = [1, 2, 3] * 300 + [4, 5] + [1, 2, 3] * 200 + [9, 1, 2, 3]
    for kw in (dict(num_candidates=3, prefer="first"), dict(num_candidates=3, prefer="recent"),
               dict(num_candidates=1, prefer="recent", partial=False)):
        kw.update(min_n=1, max_n=3, k=4)
        assert run(ngram_match, [h, h[:700]], **kw) == run(ngram_match_ref, [h, h[:700]], **kw)
        assert run(ngram_match_host, [h, h[:700]], **kw) == run(ngram_match_ref, [h, h[:700]], **kw)


@pytest.mark.parametrize("bad, name", [
    (dict(tokens=torch.zeros(4, dtype=torch.int16)), "tokens"),
    (dict(tokens=torch.zeros(2, 2, dtype=torch.int64)), "tokens"),
    (dict(tokens=torch.zeros(8, dtype=torch.int64)[::2]), "tokens"),
    (dict(cu_seqlens=torch.tensor([0, 4])), "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0, 4], dtype=torch.int32, device="meta")), "cu_seqlens"),
    (dict(k=0), "k "),
    (dict(min_n=0, max_n=2), "min_n"),
    (dict(min_n=3, max_n=2), "max_n"),
    (dict(num_candidates=0), "num_candidates"),
    (dict(num_candidates=65), "num_candidates"),
    (dict(k=1025), "k "),
    (dict(prefer="last"), "prefer"),
])
def test_bad_inputs_raise(bad, name):
    args = dict(tokens=torch.arange(4), cu_seqlens=torch.tensor([0, 4], dtype=torch.int32), min_n=1, max_n=2, k=3)
    args.update(bad)
    tokens, cu = args.pop("tokens"), args.pop("cu_seqlens")
    with pytest.raises(ValueError, match=name):
        ngram_match(tokens, cu, **args)


def test_device_histories_upload_only_what_was_appended():
    """The mirror joins the histories like the lists, copies each token from the host once,
    grows its buffers, re-uploads a list that was replaced, and forgets dropped states."""
    import gc

    from decoding.prompt_lookup import DeviceHistories
    from decoding.proposer import SeqState

    g = torch.Generator().manual_seed(5)
    states = [SeqState(i, torch.randint(0, 9, (n,), generator=g).tolist(), n) for i, n in enumerate((40, 3, 70))]
    mirror = DeviceHistories()

    def check(sts):
        tokens, cu = mirror.pack(sts, "cpu")
        assert tokens.dtype == torch.int32 and cu.dtype == torch.int32
        assert tokens.tolist() == [t for s in sts for t in s.tokens]
        assert cu.tolist() == [0] + torch.tensor([len(s.tokens) for s in sts]).cumsum(0).tolist()

    check(states)
    assert mirror.uploaded == 113
    states[0].tokens += [1, 2, 3]
    states[1].tokens += list(range(100))  # past the buffer's room: it grows, keeping what it held
    check(states)
    assert mirror.uploaded == 113 + 103
    check([states[2], states[0]])  # another batch order, nothing new
    assert mirror.uploaded == 216
    states[2].tokens = states[2].tokens[:-1] + [states[2].tokens[-1] + 1]  # not the list it was
    check(states)
    assert mirror.uploaded == 216 + 70
    assert mirror.pack([], "cpu")[0].numel() == 0
    del states[1]
    gc.collect()
    assert len(mirror._mirror) == 2


def test_lookup_states_from_the_device_mirror_equals_the_host_search(monkeypatch):
    """What pld and lookahead+pld call: the Triton kernel over the mirrored histories gives the
    host search's candidates over several steps of a ragged batch."""
    from decoding import prompt_lookup
    from decoding.prompt_lookup import DeviceHistories, PromptLookupConfig, lookup_states
    from decoding.proposer import SeqState
    from kernels.backend import get_backend

    monkeypatch.setattr(prompt_lookup, "HOST_SEARCH_TOKENS", 0)  # these short histories to the kernel too

    g = torch.Generator().manual_seed(6)
    states = [SeqState(i, torch.randint(0, 4, (n,), generator=g).tolist(), n) for i, n in enumerate((5, 30, 17))]
    cfg = PromptLookupConfig(num_candidates=3, num_draft=4)
    dev = torch.empty(0).device  # the GPU where the kernel tests run there (conftest), else the CPU
    mirror, triton_be, torch_be = DeviceHistories(), get_backend("triton", dev), get_backend("torch", dev)
    for step in range(3):
        want = lookup_states(torch_be, states, cfg, dev, mirror)  # the host search: the mirror is not used
        assert lookup_states(triton_be, states, cfg, dev, mirror) == want and any(want)
        assert mirror.uploaded == sum(len(s.tokens) for s in states)  # each token copied once
        for s in states:
            s.tokens += torch.randint(0, 4, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()


def test_short_histories_are_searched_on_the_host_whatever_the_backend(monkeypatch):
    """Up to HOST_SEARCH_TOKENS history tokens in all, the host search answers (same candidates)
    and neither the kernel nor the mirror is touched; past it, the kernel."""
    from decoding import prompt_lookup
    from decoding.prompt_lookup import DeviceHistories, PromptLookupConfig, lookup_states
    from decoding.proposer import SeqState
    from kernels.backend import get_backend

    g = torch.Generator().manual_seed(7)
    states = [SeqState(i, torch.randint(0, 5, (n,), generator=g).tolist(), n) for i, n in enumerate((40, 25))]
    cfg = PromptLookupConfig(num_candidates=2, num_draft=3)
    dev = torch.empty(0).device
    triton_be, torch_be = get_backend("triton", dev), get_backend("torch", dev)
    want = lookup_states(torch_be, states, cfg, dev, DeviceHistories())
    calls = []
    kernel = triton_be.ngram_match_found
    monkeypatch.setattr(triton_be, "ngram_match_found", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    monkeypatch.setattr(prompt_lookup, "HOST_SEARCH_TOKENS", 65)
    mirror = DeviceHistories()
    assert lookup_states(triton_be, states, cfg, dev, mirror) == want and any(want)
    assert calls == [] and mirror.uploaded == 0
    monkeypatch.setattr(prompt_lookup, "HOST_SEARCH_TOKENS", 64)
    assert lookup_states(triton_be, states, cfg, dev, mirror) == want
    assert calls == [1] and mirror.uploaded == 65
