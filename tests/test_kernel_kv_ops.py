"""kv_store / kv_compact (Triton) against kv_store_ref / kv_compact_ref: exact equality."""

import pytest
import torch

from kernels.kv_ops import kv_compact, kv_compact_ref, kv_store, kv_store_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def poisoned_cache(shape, dtype, seed):
    """Random cache with NaN sprinkled in (compared bitwise, see ``same``)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(shape, generator=g)
    c[torch.rand(shape, generator=g) < 0.2] = float("nan")
    return c.to(dtype)


def same(a, b):
    """Bitwise equality: the NaN poison must survive exactly where the reference leaves it."""
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32}
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.view(as_int[a.element_size()]), b.view(as_int[b.element_size()])))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layers", [None, 3])
def test_kv_store_matches_ref(dtype, layers):
    nb, bs, n_kv, d, T = 9, 5, 3, 24, 11
    lead = () if layers is None else (layers,)
    kc, vc = poisoned_cache(lead + (nb, bs, n_kv, d), dtype, 0), poisoned_cache(lead + (nb, bs, n_kv, d), dtype, 1)
    g = torch.Generator().manual_seed(2)
    # k / v as strided views of a fused projection, as the model passes them.
    qkv = torch.randn(lead + (T, 3 * n_kv * d), generator=g)
    k = qkv[..., n_kv * d:2 * n_kv * d].unflatten(-1, (n_kv, d))
    v = qkv[..., 2 * n_kv * d:].unflatten(-1, (n_kv, d))
    slots = torch.randperm(nb * bs, generator=g)[:T]
    slots[[1, 4, 10]] = -1  # skipped tokens
    for slot_dtype in (torch.int64, torch.int32):
        a, b = kc.clone(), vc.clone()
        kv_store(a, b, k, v, slots.to(slot_dtype))
        r, s = kc.clone(), vc.clone()
        kv_store_ref(r, s, k, v, slots)
        assert same(a, r) and same(b, s)


def test_kv_store_ref_5d_is_per_layer():
    kc, vc = torch.zeros(2, 4, 2, 1, 3), torch.zeros(2, 4, 2, 1, 3)
    k, v = torch.randn(2, 2, 1, 3), torch.randn(2, 2, 1, 3)
    kv_store_ref(kc, vc, k, v, torch.tensor([5, -1]))
    for layer in range(2):
        assert torch.equal(kc[layer, 2, 1], k[layer, 0]) and torch.equal(vc[layer, 2, 1], v[layer, 0])
    assert kc.count_nonzero() == 6


def _compact_case(layers, dtype, seed):
    bs, n_kv, d = 4, 2, 20
    block_tables = torch.tensor([[7, 2, 9, 0, -1], [4, 11, 1, -1, -1], [3, 8, 5, 10, 6]], dtype=torch.int32)
    context_lens = torch.tensor([5, 2, 9], dtype=torch.int32)
    # Overlapping moves: [0, 2, 3, 7] makes move 1 read position C + 2 that move 2 then writes.
    accept_idx = torch.tensor([[0, 2, 3, 7, -1], [1, 4, -1, -1, -1], [0, 1, 2, 5, 6]], dtype=torch.int32)
    accept_counts = torch.tensor([4, 2, 5], dtype=torch.int32)
    lead = () if layers is None else (layers,)
    shape = lead + (12, bs, n_kv, d)
    kc, vc = poisoned_cache(shape, dtype, seed), poisoned_cache(shape, dtype, seed + 1)
    return kc, vc, block_tables, context_lens, accept_idx, accept_counts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layers", [None, 1, 4])
def test_kv_compact_matches_ref(dtype, layers):
    kc, vc, *meta = _compact_case(layers, dtype, seed=3)
    a, b = kc.clone(), vc.clone()
    kv_compact(a, b, *meta)
    r, s = kc.clone(), vc.clone()
    kv_compact_ref(r, s, *meta)
    assert same(a, r) and same(b, s)
    assert not same(a, kc)  # something moved


def test_kv_compact_overlapping_moves_by_hand():
    """Positions C + [0, 2, 3, 7] -> C + [0, 1, 2, 3], values checked one by one (no reference)."""
    bs, C = 4, 3
    kc = torch.arange(6 * bs, dtype=torch.float32).view(6, bs, 1, 1).repeat(1, 1, 1, 8)
    vc = -kc
    bt = torch.tensor([[5, 0, 3, 1]], dtype=torch.int32)  # logical block j lives in physical bt[j]
    kv_compact(kc, vc, bt, torch.tensor([C], dtype=torch.int32), torch.tensor([[0, 2, 3, 7]], dtype=torch.int32),
               torch.tensor([4], dtype=torch.int32))

    def value(cache, pos):
        return cache[bt[0, pos // bs], pos % bs, 0, 0].item()

    orig = torch.arange(6 * bs, dtype=torch.float32).view(6, bs)
    expect = {C + i: orig[bt[0, (C + a) // bs], (C + a) % bs].item() for i, a in enumerate([0, 2, 3, 7])}
    for pos, val in expect.items():
        assert value(kc, pos) == val and value(vc, pos) == -val


def test_kv_compact_counts_zero_and_identity_moves():
    kc, vc, bt, ctx, _, _ = _compact_case(2, torch.float32, seed=4)
    idx = torch.tensor([[0, 1, 2, -1, -1], [0, -1, -1, -1, -1], [0, 1, 2, 3, 4]], dtype=torch.int32)
    counts = torch.tensor([3, 0, 5], dtype=torch.int32)
    a, b = kc.clone(), vc.clone()
    kv_compact(a, b, bt, ctx, idx, counts)
    assert same(a, kc) and same(b, vc)


# ---- bad inputs ----

def test_kv_store_bad_inputs():
    kc, vc = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    k, v = torch.zeros(3, 2, 8), torch.zeros(3, 2, 8)
    slots = torch.tensor([0, 1, -1])
    cases = [
        ("k_cache", lambda: kv_store(kc[0], vc, k, v, slots)),
        ("k_cache", lambda: kv_store(kc.double(), vc, k, v, slots)),
        ("v_cache", lambda: kv_store(kc, vc.half(), k, v, slots)),
        ("k_cache", lambda: kv_store(kc.transpose(2, 3), vc.transpose(2, 3), k, v, slots)),
        ("k ", lambda: kv_store(kc, vc, k[0], v, slots)),
        ("k ", lambda: kv_store(kc, vc, k.to(torch.int32), v, slots)),
        ("v ", lambda: kv_store(kc, vc, k, v.transpose(1, 2).contiguous().transpose(1, 2), slots)),
        ("k ", lambda: kv_store(kc, vc, k[:, :1], v[:, :1], slots)),
        ("slot_mapping", lambda: kv_store(kc, vc, k, v, slots.to(torch.int16))),
        ("slot_mapping", lambda: kv_store(kc, vc, k, v, slots[:2])),
        ("slot_mapping", lambda: kv_store(kc, vc, k, v, slots.to("meta"))),
        ("k ", lambda: kv_store(kc[None], vc[None], k, v, slots)),
    ]
    for name, fn in cases:
        with pytest.raises(ValueError, match=name):
            fn()


def test_kv_compact_bad_inputs():
    kc, vc, bt, ctx, idx, counts = _compact_case(None, torch.float32, seed=5)
    cases = [
        ("k_cache", lambda: kv_compact(kc[0], vc[0], bt, ctx, idx, counts)),
        ("v_cache", lambda: kv_compact(kc, vc[:-1], bt, ctx, idx, counts)),
        ("block_tables", lambda: kv_compact(kc, vc, bt.long(), ctx, idx, counts)),
        ("context_lens", lambda: kv_compact(kc, vc, bt, ctx[:, None], idx, counts)),
        ("accept_idx", lambda: kv_compact(kc, vc, bt, ctx, idx.t(), counts)),
        ("accept_idx", lambda: kv_compact(kc, vc, bt, ctx, idx.to(torch.int16), counts)),
        ("accept_counts", lambda: kv_compact(kc, vc, bt, ctx, idx, counts[:2])),
        ("accept_counts", lambda: kv_compact(kc, vc, bt, ctx, idx, counts.to("meta"))),
    ]
    for name, fn in cases:
        with pytest.raises(ValueError, match=name):
            fn()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kv_heads, d", [(4, 2, 24), (3, 3, 10), (6, 1, 64)])
def test_rope_store_is_rope_then_kv_store(dtype, heads, kv_heads, d):
    """One launch for RoPE of the q and k heads and the store of k and v: bit for bit the two
    kernels it replaces (the cache and qkv), and their references (bf16 under the interpreter:
    its casts truncate)."""
    from kernels.backend import triton_interpreted
    from kernels.elementwise import rope
    from kernels.kv_ops import rope_store, rope_store_ref

    nb, bs, T, layers = 7, 4, 9, 3
    shape = (layers, nb, bs, kv_heads, d)
    pool_k, pool_v = poisoned_cache(shape, dtype, 3), poisoned_cache(shape, dtype, 4)
    g = torch.Generator().manual_seed(heads * d)
    qkv = torch.randn(T, (heads + 2 * kv_heads) * d + 5, generator=g).to(dtype)  # rows a little wider
    ang = torch.rand(T, d // 2, generator=g) * 50
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([-ang.sin(), ang.sin()], -1).to(dtype)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    slots[[2, 7]] = -1  # padding rows: not stored
    a, ka, va = qkv.clone(), pool_k.clone(), pool_v.clone()
    rope_store(a, cos, sin, heads, kv_heads, ka[1], va[1], slots)
    b, kb, vb = qkv.clone(), pool_k.clone(), pool_v.clone()
    rope(b, cos, sin, heads + kv_heads, d)
    kv_store(kb[1], vb[1], b[:, heads * d:(heads + kv_heads) * d].view(T, kv_heads, d),
             b[:, (heads + kv_heads) * d:(heads + 2 * kv_heads) * d].view(T, kv_heads, d), slots)
    assert same(a, b) and same(ka, kb) and same(va, vb)
    c, kr, vr = qkv.clone(), pool_k.clone(), pool_v.clone()
    rope_store_ref(c, cos, sin, heads, kv_heads, kr[1], vr[1], slots)
    if dtype == torch.bfloat16 and triton_interpreted():
        torch.testing.assert_close(a, c, rtol=2 ** -6, atol=3 * 2 ** -7 * float(qkv.abs().max()))
    else:
        assert same(a, c) and same(ka, kr) and same(va, vr)


def test_rope_store_bad_inputs():
    from kernels.kv_ops import rope_store

    kc = torch.zeros(4, 2, 2, 8)
    qkv, cs, slots = torch.zeros(3, 48), torch.zeros(3, 8), torch.zeros(3, dtype=torch.int64)
    for args, match in [
        ((qkv, cs, cs, 2, 1, kc, kc, slots), "kv_heads the caches' 2"),
        ((qkv[:, :40], cs, cs, 2, 2, kc, kc, slots), "qkv rows must hold"),
        ((qkv, cs, cs, 2, 2, kc.half(), kc.half(), slots), "caches must be qkv's dtype"),
        ((qkv, cs[:2], cs, 2, 2, kc, kc, slots), "cos must be"),
        ((qkv, cs, cs, 2, 2, kc, kc, slots[:2]), "slot_mapping must have 3"),
        ((qkv, cs, cs, 2, 2, kc[None], kc[None], slots), "4-D"),
    ]:
        with pytest.raises(ValueError, match=match):
            rope_store(*args)
    if kc.device.type == "cpu":  # a slot past the cache: checked on a CPU (on a GPU under SPECDEC_CHECK_VALUES=1)
        with pytest.raises(ValueError, match="slot_mapping"):
            rope_store(qkv, cs, cs, 2, 2, kc, kc, torch.tensor([0, 1, 8], dtype=torch.int64))
