"""The torch backend's planned path (per-step work done once for all layers) against the
readable references: tree_attention_ref and kv_store_ref, on the same odd batches the Triton
kernel is tested with."""

import pytest
import torch

from kernels.backend import StepMeta, TorchBackend
from kernels.kv_ops import kv_store_ref
from kernels.torch_plan import attention_planned, kv_store_planned, plan_step
from kernels.tree_attention import tree_attention_ref
from test_kernel_tree_attention import MIXED, TOL, Seq, make_batch


def plan_of(batch, window=None, slots=None):
    slots = torch.zeros(batch.q.shape[0], dtype=torch.int64) if slots is None else slots
    return plan_step(batch.cu, batch.positions, batch.block_tables, batch.context_lens, slots, batch.mask,
                     batch.causal, batch.k_cache.shape[1], window)


@pytest.fixture(params=["skinny", "sdpa"])
def small_path(request, monkeypatch):
    """Steps of few rows go to the skinny C kernel where it builds (x86, fp32); the SDPA path
    is tested as well, with the kernel switched off."""
    from kernels import skinny

    if request.param == "skinny" and not skinny.available():
        pytest.skip(f"skinny kernel: {skinny.unavailable_reason()}")
    calls = []
    real = skinny.attention_unchecked
    monkeypatch.setattr(skinny, "attention_unchecked", lambda *a, **k: calls.append(1) or real(*a, **k))
    if request.param == "sdpa":
        monkeypatch.setattr(skinny, "available", lambda: False)
    return request.param, calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["mixed", "masked"])
@pytest.mark.parametrize("window", [None, 4, 17])
@pytest.mark.parametrize("n_heads, n_kv", [(6, 2), (4, 4)])
def test_planned_attention_equals_ref(dtype, mode, window, n_heads, n_kv, small_path):
    batch = make_batch(MIXED, n_heads, n_kv, 32, dtype, mode=mode, window=window, seed=3)
    ref = tree_attention_ref(*batch.args(), mask=batch.mask, causal=batch.causal, sliding_window=window)
    out = attention_planned(batch.q, batch.k_cache, batch.v_cache, plan_of(batch, window), 32**-0.5)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol["atol"], rtol=tol["rtol"])
    path, calls = small_path
    assert bool(calls) == (path == "skinny" and dtype == torch.float32)


def test_planned_attention_all_causal_and_consecutive_blocks(small_path):
    seqs = [Seq(C=0, T=9), Seq(C=21, T=1), Seq(C=3, T=5)]
    batch = make_batch(seqs, 4, 2, 16, torch.float32, mode="none", block_size=4)
    # one sequence on consecutive blocks (the view path), the others shuffled (the gather path)
    plan = plan_of(batch)
    ref = tree_attention_ref(*batch.args())
    torch.testing.assert_close(attention_planned(batch.q, batch.k_cache, batch.v_cache, plan, 16**-0.5), ref)
    single = make_batch([Seq(C=30, T=3)], 4, 2, 16, torch.float32, mode="none", block_size=4)
    n = -(-33 // 4)
    single.block_tables[0, :n] = torch.arange(2, 2 + n, dtype=torch.int32)  # consecutive blocks 2, 3, ...
    single.k_cache[2:2 + n] = torch.randn(n, 4, 2, 16)
    single.v_cache[2:2 + n] = torch.randn(n, 4, 2, 16)
    plan = plan_of(single)
    assert plan.seqs[0].first_block == 2
    torch.testing.assert_close(attention_planned(single.q, single.k_cache, single.v_cache, plan, 16**-0.5),
                               tree_attention_ref(*single.args()))


@pytest.mark.parametrize("slots", [[8, 9, 10, 11], [3, 17, 4, 30], [5, -1, 6, 7]])
def test_planned_kv_store_equals_ref(slots):
    g = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(10, 4, 2, 8, generator=g), torch.randn(10, 4, 2, 8, generator=g)
    k, v = torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)
    sm = torch.tensor(slots)
    batch = make_batch([Seq(C=0, T=4)], 2, 2, 8, torch.float32, mode="none")
    plan = plan_of(batch, slots=sm)
    assert (plan.slot_start is not None) == (slots == [8, 9, 10, 11])
    k_ref, v_ref = kc.clone(), vc.clone()
    kv_store_ref(k_ref, v_ref, k, v, sm)
    kv_store_planned(kc, vc, k, v, plan)
    assert torch.equal(kc, k_ref) and torch.equal(vc, v_ref)


def test_backend_without_plan_is_the_reference():
    batch = make_batch(MIXED, 6, 2, 32, torch.float32, seed=1)
    meta = StepMeta(batch.cu, batch.positions, batch.block_tables, batch.context_lens,
                    torch.zeros(batch.q.shape[0], dtype=torch.int64), batch.max_seqlen_q, batch.mask, batch.causal)
    be = TorchBackend()
    plain = be.attention(batch.q, batch.k_cache, batch.v_cache, meta, 0.2, None)
    planned = be.attention(batch.q, batch.k_cache, batch.v_cache, meta, 0.2, None,
                           be.plan(meta, batch.k_cache.shape[1], None))
    torch.testing.assert_close(planned, plain, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("mode", ["mixed", "none", "masked"])
@pytest.mark.parametrize("window", [None, 17, 150])
def test_prompts_go_to_the_prefill_kernel(mode, window, monkeypatch):
    """A prompt's rows under the causal rule (with or without a committed prefix, more rows
    than a decoding step's) go to the CPU prefill kernel, a short prompt without a prefix too;
    a few rows after a prefix stay on the skinny kernel, trees and sliding windows on SDPA. A
    window of 150 positions hides nothing from sequences of at most 150 keys: as without one.
    Every output is the reference's."""
    from kernels import skinny

    if not skinny.available():
        pytest.skip(f"skinny kernel: {skinny.unavailable_reason()}")
    calls = []
    real = skinny.prefill_unchecked
    monkeypatch.setattr(skinny, "prefill_unchecked", lambda q, *a, **k: calls.append(q.shape[0]) or real(q, *a, **k))
    seqs = [Seq(C=0, T=90), Seq(C=70, T=80), Seq(C=0, T=20), Seq(C=30, T=5)]
    seqs += [Seq(C=10, T=70, rule="tree")] if mode != "none" else []  # (no mask: every sequence causal)
    batch = make_batch(seqs, 6, 2, 64, torch.float32, mode=mode, window=window, seed=4)
    ref = tree_attention_ref(*batch.args(), mask=batch.mask, causal=batch.causal, sliding_window=window)
    out = attention_planned(batch.q, batch.k_cache, batch.v_cache, plan_of(batch, window), 64**-0.5)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-6)
    # "masked": every sequence's rows come as an explicit mask (no causal flags): none is a prompt
    assert calls == ([] if window == 17 or mode == "masked" else [90, 80, 20])


def test_a_trees_visibility_is_unpacked_as_the_mask_words_say():
    """skinny.visibility (one C call) against ``torch.ones`` + ``unpack_mask`` beside the context:
    random words of 1-3 per row (rows past 32 and 64), contexts from 0; a plan made with the C
    helper switched off holds the same masks; words that are not contiguous int32 CPU rows are
    left to torch."""
    from kernels import skinny
    from kernels.mask import pack_mask, unpack_mask

    if not skinny.available():
        pytest.skip(f"skinny kernels: {skinny.unavailable_reason()}")
    g = torch.Generator().manual_seed(4)
    for T, C in ((1, 0), (5, 3), (32, 17), (33, 0), (70, 40)):
        words = pack_mask(torch.rand(T, T, generator=g) < 0.5)
        ref = torch.ones(T, C + T, dtype=torch.bool)
        ref[:, C:] = unpack_mask(words, T)
        got = skinny.visibility(words, C)
        assert got.dtype == torch.bool and torch.equal(got, ref), (T, C)
    assert skinny.visibility(words.t(), 0) is None and skinny.visibility(words.long(), 0) is None
    with pytest.raises(ValueError, match=r"context must be an int >= 0 .*got -1"):
        skinny.visibility(words, -1)
    with pytest.raises(ValueError, match=r"words must hold a bit per row: 40 rows need >= 2 words, got 1"):
        skinny.visibility(torch.zeros(40, 1, dtype=torch.int32), 0)
    batch = make_batch(MIXED, 4, 2, 16, torch.float32, mode="masked", seed=5)
    with_c = plan_of(batch)
    real = skinny.visibility
    try:
        skinny.visibility = lambda *a: None
        without = plan_of(batch)
    finally:
        skinny.visibility = real
    masks = [(a.mask, b.mask) for a, b in zip(with_c.seqs, without.seqs)]
    assert any(a is not None for a, _ in masks)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in masks)


def test_a_chain_after_a_prefix_is_planned_as_the_causal_rule_not_as_mask_bytes():
    """A causal step of several rows after a committed prefix (a chain of drafts) carries the
    causal rule as a flag for the C kernels (no (T, L) mask made per step); its mask, made on first
    use for SDPA, is the rule's; and the C kernel's rows under the flag equal, bit for bit, its rows
    under the mask bytes."""
    from kernels import skinny

    seqs = [Seq(C=37, T=4), Seq(C=0, T=6), Seq(C=64, T=1), Seq(C=5, T=3)]
    batch = make_batch(seqs, 6, 2, 16, torch.float32, mode="none", block_size=4)
    plan = plan_of(batch)
    tail = [sp.tail_causal for sp in plan.seqs]
    assert tail == [True, False, False, True] and all(sp._mask is None for sp in plan.seqs)
    for sp in plan.seqs:
        if sp.tail_causal:
            T, L = sp.end - sp.start, sp.length
            assert torch.equal(sp.mask, torch.ones(T, L, dtype=torch.bool).tril(diagonal=L - T))
    if not skinny.available():
        pytest.skip(f"skinny kernel: {skinny.unavailable_reason()}")
    for sp in plan.seqs:
        if sp.tail_causal:
            q = batch.q[sp.start:sp.end]
            flag = skinny.attention_unchecked(q, batch.k_cache, batch.v_cache, sp.block_ids, sp.length, None, True,
                                              0.25)
            masked = skinny.attention_unchecked(q, batch.k_cache, batch.v_cache, sp.block_ids, sp.length,
                                                sp.mask, False, 0.25)
            assert torch.equal(flag, masked)
    ref = tree_attention_ref(*batch.args())
    torch.testing.assert_close(attention_planned(batch.q, batch.k_cache, batch.v_cache, plan, 16**-0.5), ref)
