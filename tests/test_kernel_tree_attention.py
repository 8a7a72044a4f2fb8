"""tree_attention (Triton) against tree_attention_ref and against an independent dense fp64
attention built from each step's own structure (tree parents, causal flags, window).

Shapes are small and odd on purpose: the kernels run under Triton's interpreter on CPU.
"""

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from kernels.mask import pack_mask
from kernels.tree_attention import MAX_MASK_WORDS, tree_attention, tree_attention_ref

# Error budget per dtype, stated once:
#   |kernel - tree_attention_ref| <= atol + rtol * |ref|   (the ref is fp32 math rounded to the dtype)
#   |kernel - fp64 truth| <= factor * |torch at the dtype - fp64 truth| + floor
TOL = {
    torch.float32: dict(atol=2e-6, rtol=2e-6, factor=4.0, floor=1e-6),
    torch.float16: dict(atol=1e-3, rtol=2e-3, factor=2.0, floor=5e-4),
    torch.bfloat16: dict(atol=8e-3, rtol=1.6e-2, factor=2.0, floor=4e-3),
}
DTYPES = list(TOL)


@dataclass
class Seq:
    C: int  # committed prefix
    T: int  # step tokens
    rule: str = "causal"  # "causal" (prefill / decode / chain) or "tree" (random ancestor mask)


@dataclass
class Batch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu: torch.Tensor
    positions: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    mask: Optional[torch.Tensor]
    causal: Optional[torch.Tensor]
    vis: list  # per sequence (T, C + T) bool, built independently of the kernels' mask layout
    max_seqlen_q: int

    def args(self):
        return (self.q, self.k_cache, self.v_cache, self.cu, self.positions, self.block_tables,
                self.context_lens)


def make_batch(seqs, n_heads, n_kv, head_dim, dtype, *, block_size=16, window=None, mode="mixed", seed=0):
    """mode: "mixed" = mask + per-sequence causal flags (mask rows of causal sequences are random
    garbage, which the kernel must ignore); "none" = mask=None (every sequence causal);
    "masked" = mask with causal=None (causal sequences get explicit lower-triangular rows)."""
    g = torch.Generator().manual_seed(seed)
    B = len(seqs)
    T_total = sum(s.T for s in seqs)
    step_vis, positions = [], []
    for s in seqs:
        if s.rule == "tree":
            parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, s.T)]
            anc = torch.zeros(s.T, s.T, dtype=torch.bool)
            depth = [0] * s.T
            for i in range(s.T):
                if parent[i] >= 0:
                    anc[i] = anc[parent[i]]
                    depth[i] = depth[parent[i]] + 1
                anc[i, i] = True
            step_vis.append(anc)
            positions.append(torch.tensor(depth, dtype=torch.int32) + s.C)
        else:
            step_vis.append(torch.ones(s.T, s.T, dtype=torch.bool).tril())
            positions.append(torch.arange(s.C, s.C + s.T, dtype=torch.int32))
    positions = torch.cat(positions) if positions else torch.zeros(0, dtype=torch.int32)

    # Oversized pool, shuffled block tables, NaN in every slot no sequence owns.
    need = [-(-(s.C + s.T) // block_size) for s in seqs]
    num_blocks = sum(need) + 7
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    block_tables = torch.full((B, max(need, default=0) + 2), -1, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, n_kv, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    used = 0
    for b, (s, n) in enumerate(zip(seqs, need)):
        blocks = perm[used:used + n]
        used += n
        block_tables[b, :n] = blocks
        L = s.C + s.T
        flat = torch.randn(n * block_size, n_kv, head_dim, generator=g)
        flat[L:] = float("nan")
        k_cache[blocks.long()] = flat.view(n, block_size, n_kv, head_dim)
        flat = torch.randn(n * block_size, n_kv, head_dim, generator=g)
        flat[L:] = float("nan")
        v_cache[blocks.long()] = flat.view(n, block_size, n_kv, head_dim)
    q = torch.randn(T_total, n_heads, head_dim, generator=g)

    masked = [s.rule == "tree" or mode == "masked" for s in seqs]
    if mode == "none":
        assert not any(s.rule == "tree" for s in seqs)
        mask = causal = None
    else:
        n_words = max([-(-s.T // 32) for s, m in zip(seqs, masked) if m] + [1])
        mask = torch.randint(-2**31, 2**31 - 1, (T_total, n_words), dtype=torch.int32, generator=g)
        row = 0
        for s, m, sv in zip(seqs, masked, step_vis):
            if m and s.T:
                mask[row:row + s.T] = 0
                mask[row:row + s.T, :-(-s.T // 32)] = pack_mask(sv)
            row += s.T
        causal = None if mode == "masked" else torch.tensor([not m for m in masked])

    vis, row = [], 0
    for s, sv in zip(seqs, step_vis):
        v = torch.cat([torch.ones(s.T, s.C, dtype=torch.bool), sv], dim=1)
        if window is not None:
            q_pos = positions[row:row + s.T].long()
            k_pos = torch.cat([torch.arange(s.C), q_pos])
            v &= (q_pos[:, None] - k_pos[None, :]) < window
        vis.append(v)
        row += s.T
    cu = torch.tensor([0] + [s.T for s in seqs], dtype=torch.int32).cumsum(0).to(torch.int32)
    ctx = torch.tensor([s.C for s in seqs], dtype=torch.int32)
    return Batch(q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), cu, positions, block_tables, ctx,
                 mask, causal, vis, max((s.T for s in seqs), default=0))


def dense_attention(batch: Batch, dtype, scale):
    """Gather each sequence's keys and run SDPA at ``dtype`` under the independently built mask."""
    q, kc, vc = batch.q.to(dtype), batch.k_cache.to(dtype), batch.v_cache.to(dtype)
    n_heads, n_kv, bs = q.shape[1], kc.shape[2], kc.shape[1]
    out = torch.zeros_like(q)
    cu = batch.cu.tolist()
    for b, vis in enumerate(batch.vis):
        s, e = cu[b], cu[b + 1]
        if s == e:
            continue
        L = vis.shape[1]
        blocks = batch.block_tables[b, :-(-L // bs)].long()
        k = kc[blocks].flatten(0, 1)[:L].repeat_interleave(n_heads // n_kv, dim=1).transpose(0, 1)
        v = vc[blocks].flatten(0, 1)[:L].repeat_interleave(n_heads // n_kv, dim=1).transpose(0, 1)
        o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1), k, v, attn_mask=vis, scale=scale)
        out[s:e] = o.transpose(0, 1)
    return out


def run_kernel(batch: Batch, window=None, scale=None, pass_max=True, splits=None):
    out = torch.full_like(batch.q, float("nan"))  # poisoned: every row must be written
    res = tree_attention(*batch.args(), mask=batch.mask, causal=batch.causal, scale=scale,
                         sliding_window=window, max_seqlen_q=batch.max_seqlen_q if pass_max else None, out=out,
                         num_kv_splits=splits)
    assert res is out
    return out


def check_against_ref(batch: Batch, window=None, scale=None, pass_max=True, splits=None):
    out = run_kernel(batch, window, scale, pass_max, splits)
    ref = tree_attention_ref(*batch.args(), mask=batch.mask, causal=batch.causal, scale=scale,
                             sliding_window=window)
    assert not out.isnan().any()
    tol = TOL[batch.q.dtype]
    err = (out.float() - ref.float()).abs()
    bound = tol["atol"] + tol["rtol"] * ref.float().abs()
    assert (err <= bound).all(), f"max err {err.max().item():.3g} (worst excess {(err - bound).max().item():.3g})"
    return out


MIXED = [
    Seq(C=37, T=1),  # decode
    Seq(C=0, T=23),  # prefill
    Seq(C=19, T=13, rule="tree"),  # tree verification
    Seq(C=0, T=0),  # idle sequence: no rows
    Seq(C=50, T=6),  # PLD chain
    Seq(C=5, T=1),  # decode, short prefix
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_heads, n_kv", [(2, 2), (6, 2), (4, 1)])
def test_mixed_batch_matches_ref(dtype, head_dim, n_heads, n_kv):
    batch = make_batch(MIXED, n_heads, n_kv, head_dim, dtype, block_size=16, seed=head_dim + n_heads)
    check_against_ref(batch)


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_within_torch_error_at_dtype(dtype):
    """Kernel vs fp64 truth is within a small factor of torch's own SDPA at the same dtype."""
    batch = make_batch(MIXED, 6, 2, 64, dtype, block_size=5, window=None, seed=3)
    scale = 0.3
    out = run_kernel(batch, scale=scale).double()
    truth = dense_attention(batch, torch.float64, scale)
    torch_err = (dense_attention(batch, dtype, scale).double() - truth).abs().max().item()
    err = (out - truth).abs().max().item()
    tol = TOL[dtype]
    assert err <= tol["factor"] * torch_err + tol["floor"], (err, torch_err)


def test_ref_matches_dense_truth():
    """The reference follows the layout doc: checked against masks built from the tree itself."""
    batch = make_batch(MIXED, 4, 2, 32, torch.float32, block_size=7, window=9, seed=4)
    ref = tree_attention_ref(*batch.args(), mask=batch.mask, causal=batch.causal, sliding_window=9)
    truth = dense_attention(batch, torch.float64, 32**-0.5)
    torch.testing.assert_close(ref.double(), truth, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 4, 17])
def test_sliding_window_shorter_than_context(dtype, window):
    seqs = [Seq(C=45, T=1), Seq(C=30, T=9, rule="tree"), Seq(C=0, T=21), Seq(C=28, T=5)]
    batch = make_batch(seqs, 4, 2, 64, dtype, block_size=8, window=window, seed=window)
    check_against_ref(batch, window=window)
    if dtype == torch.float32:
        truth = dense_attention(batch, torch.float64, 64**-0.5)
        torch.testing.assert_close(run_kernel(batch, window).double(), truth, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mask_none_means_all_causal(dtype):
    seqs = [Seq(C=9, T=1), Seq(C=0, T=17), Seq(C=33, T=4)]
    batch = make_batch(seqs, 3, 1, 64, dtype, block_size=4, mode="none", seed=5)
    check_against_ref(batch)


def test_mask_without_causal_flags_masks_every_sequence():
    seqs = [Seq(C=9, T=1), Seq(C=0, T=17), Seq(C=12, T=10, rule="tree")]
    batch = make_batch(seqs, 4, 4, 64, torch.float32, block_size=16, mode="masked", seed=6)
    check_against_ref(batch)


def test_max_seqlen_q_optional():
    batch = make_batch(MIXED, 4, 2, 64, torch.float32, seed=7)
    a = run_kernel(batch, pass_max=True)
    b = run_kernel(batch, pass_max=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype, splits, window", [
    (torch.float32, 2, None), (torch.float16, 3, 11), (torch.bfloat16, 7, None), (torch.float32, 7, 11)])
def test_split_kv_matches_ref(dtype, splits, window):
    """Prefix cut into key ranges and merged (flash decoding). Short prefixes leave most splits
    empty; the prefill (C = 0) has only the last split's step keys."""
    seqs = MIXED + [Seq(C=200, T=1), Seq(C=130, T=5, rule="tree")]
    batch = make_batch(seqs, 6, 2, 64, dtype, block_size=16, window=window, seed=splits)
    check_against_ref(batch, window=window, splits=splits)


def test_tree_step_of_128_tokens():
    """T = 128 tree step (4 mask words) beside a decode, small heads to keep it quick."""
    seqs = [Seq(C=40, T=128, rule="tree"), Seq(C=3, T=1)]
    batch = make_batch(seqs, 2, 1, 16, torch.float32, block_size=16, seed=8)
    assert batch.mask.shape[1] == 4
    check_against_ref(batch)


@pytest.mark.parametrize("head_dim", [16, 32, 40, 80])
def test_other_head_dims(head_dim):
    seqs = [Seq(C=11, T=1), Seq(C=7, T=9, rule="tree")]
    batch = make_batch(seqs, 4, 2, head_dim, torch.float16, block_size=16, seed=head_dim)
    check_against_ref(batch)


def test_padded_mask_words_up_to_limit():
    """Mask words beyond a step's length are padding; the full 32-word width is accepted."""
    seqs = [Seq(C=6, T=20, rule="tree"), Seq(C=2, T=3)]
    batch = make_batch(seqs, 2, 1, 16, torch.float32, block_size=4, seed=9)
    wide = torch.zeros(batch.mask.shape[0], MAX_MASK_WORDS, dtype=torch.int32)
    wide[:, :1] = batch.mask
    batch.mask = wide
    check_against_ref(batch)


def test_mqa_group_larger_than_tile_rows():
    """16 query heads on one KV head: the heads of a single token fill a whole tile."""
    seqs = [Seq(C=21, T=1), Seq(C=4, T=7, rule="tree")]
    batch = make_batch(seqs, 16, 1, 32, torch.bfloat16, block_size=16, seed=10)
    check_against_ref(batch)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_prefill_and_max_tree(dtype):
    seqs = [Seq(C=300, T=200), Seq(C=500, T=1), Seq(C=64, T=1024, rule="tree")]
    batch = make_batch(seqs, 2, 1, 64, dtype, block_size=16, window=None, seed=11)
    assert batch.mask.shape[1] == MAX_MASK_WORDS
    check_against_ref(batch)


# ---- bad inputs: a clear ValueError naming the argument ----

def _bad_cases():
    def base():
        return make_batch([Seq(C=5, T=3, rule="tree"), Seq(C=2, T=1)], 4, 2, 64, torch.float32, seed=12)

    def call(b, **kw):
        args = dict(q=b.q, k_cache=b.k_cache, v_cache=b.v_cache, cu_seqlens_q=b.cu, positions=b.positions,
                    block_tables=b.block_tables, context_lens=b.context_lens, mask=b.mask, causal=b.causal)
        args.update(kw)
        return lambda: tree_attention(**args)

    b = base()
    return [
        ("q", call(b, q=b.q.double())),
        ("k_cache", call(b, k_cache=b.k_cache.half())),
        ("q", call(b, q=b.q[0])),
        ("k_cache", call(b, k_cache=b.k_cache[0])),
        ("n_heads", call(b, q=b.q[:, :3].contiguous())),
        ("head_dim", call(b, q=torch.zeros(b.q.shape[0], 4, 300), k_cache=torch.zeros(4, 16, 2, 300),
                          v_cache=torch.zeros(4, 16, 2, 300))),
        ("head_dim", call(b, q=b.q[..., :32].contiguous())),
        ("q", call(b, q=b.q.transpose(1, 2).contiguous().transpose(1, 2))),
        ("cu_seqlens_q", call(b, cu_seqlens_q=b.cu.long())),
        ("positions", call(b, positions=b.positions[:-1])),
        ("block_tables", call(b, block_tables=b.block_tables[:1])),
        ("context_lens", call(b, context_lens=b.context_lens.long())),
        ("mask", call(b, mask=torch.zeros(b.q.shape[0], MAX_MASK_WORDS + 1, dtype=torch.int32))),
        ("mask", call(b, mask=b.mask.long())),
        ("causal", call(b, causal=b.causal.int())),
        ("device", call(b, positions=b.positions.to("meta"))),
    ]


@pytest.mark.parametrize("name, fn", _bad_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs_raise(name, fn):
    with pytest.raises(ValueError, match=name):
        fn()


def test_bad_window_and_max_seqlen():
    b = make_batch([Seq(C=5, T=3)], 2, 2, 16, torch.float32, mode="none", seed=13)
    with pytest.raises(ValueError, match="sliding_window"):
        tree_attention(*b.args(), sliding_window=0)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        tree_attention(*b.args(), max_seqlen_q=-1)
    with pytest.raises(ValueError, match="num_kv_splits"):
        tree_attention(*b.args(), num_kv_splits=0)


def test_reference_consecutive_blocks_view_equals_gather():
    """The reference reads consecutive blocks through a view instead of a gather: the same
    K/V stored at consecutive blocks and at scattered ones give the same output, and both
    equal dense attention written out by hand."""
    g = torch.Generator().manual_seed(7)
    H, KV, D, bs, C = 4, 2, 16, 4, 9
    n_blk = -(-(C + 1) // bs)
    keys = torch.randn(n_blk * bs, KV, D, generator=g)
    vals = torch.randn(n_blk * bs, KV, D, generator=g)
    q = torch.randn(1, H, D, generator=g)
    outs = []
    for table in (list(range(2, 2 + n_blk)), [5, 0, 3][:n_blk]):
        k_cache = torch.full((6, bs, KV, D), float("nan"))
        v_cache = torch.full((6, bs, KV, D), float("nan"))
        for j, blk in enumerate(table):
            k_cache[blk] = keys[j * bs:(j + 1) * bs]
            v_cache[blk] = vals[j * bs:(j + 1) * bs]
        outs.append(tree_attention_ref(q, k_cache, v_cache, torch.tensor([0, 1], dtype=torch.int32),
                                       torch.tensor([C], dtype=torch.int32),
                                       torch.tensor([table], dtype=torch.int32),
                                       torch.tensor([C], dtype=torch.int32)))
    k, v = keys[:C + 1].repeat_interleave(H // KV, 1), vals[:C + 1].repeat_interleave(H // KV, 1)
    w = torch.softmax(torch.einsum("hd,lhd->hl", q[0], k) * D**-0.5, dim=-1)
    dense = torch.einsum("hl,lhd->hd", w, v)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0][0], dense, rtol=1e-5, atol=1e-5)
