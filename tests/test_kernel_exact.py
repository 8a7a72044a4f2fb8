"""The exact path's kernels (docs/DESIGN.md, "The exact path"): ``exact_linear`` against its
reference and a row's product bit for bit the same in steps of 1, 7, 64 and 256 rows; the exact
attention (``tree_attention(exact=True)``) against the reference, and a row's output bit for bit
the same in its own decoding step as in a tree step, a chain or a ragged batch that holds it.

Under the CPU interpreter the dots are numpy's: these checks are necessary there, not
sufficient; on a GPU (tests/conftest.py runs this file natively) they check the compiled kernels.
"""

import random

import pytest
import torch

from kernels.exact_linear import TILE, exact_linear, exact_linear_ref
from kernels.mask import pack_mask
from kernels.tree_attention import step_order, step_order_ref, tree_attention, tree_attention_ref

# against the fp32 reference rounded once: fp32, another order of the sums; 16-bit, one rounding
# step (the CPU interpreter truncates to bf16 instead of rounding)
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


# ---- products -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("M, K, N, bias", [(1, 33, 17, False), (7, 200, 130, True), (64, 129, 65, True),
                                           (3, 8, 1, False)])
def test_exact_linear_matches_ref(dtype, M, K, N, bias):
    x, w = rand((M, K), dtype, M + K), rand((N, K), dtype, N, 0.2)
    b = rand((N,), dtype, 7) if bias else None
    torch.testing.assert_close(exact_linear(x, w, b), exact_linear_ref(x, w, b), **TOL[dtype])


def test_fp32_logits_from_16_bit_rows_and_strided_rows():
    big = rand((5, 300), torch.bfloat16, 1)
    x, w = big[:, 10:110], rand((70, 100), torch.bfloat16, 2, 0.1)  # rows 300 apart
    y = exact_linear(x, w, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and y.is_contiguous()
    torch.testing.assert_close(y, exact_linear_ref(x, w, out_dtype=torch.float32), rtol=1e-5, atol=1e-5)
    assert exact_linear(torch.zeros(0, 100, dtype=torch.bfloat16), w).shape == (0, 70)
    b = rand((3,), torch.float32, 3)  # K = 0: the bias alone
    assert torch.equal(exact_linear(torch.zeros(2, 0), torch.zeros(3, 0), b), b.expand(2, 3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_a_rows_product_does_not_depend_on_the_step(dtype):
    """Every row of a 256-row product, computed again in steps of 1, 7 and 64 rows taken at
    offsets that put it at every place of a tile: the same bits. K and N are not multiples of
    the tile (K spans 2-3 K tiles, N 2 N tiles), and there is a bias."""
    bm, bn, bk = TILE[dtype]
    K, N = 2 * bk + 21, bn + 13
    x, w, b = rand((256, K), dtype, 1), rand((N, K), dtype, 2, 0.1), rand((N,), dtype, 3)
    full = exact_linear(x, w, b)
    for m, starts in ((1, [0, 1, 15, 16, 100, 255]), (7, [0, 5, 13, 249]), (64, [0, 3, 17, 192])):
        for s in starts:
            part = exact_linear(x[s:s + m], w, b)
            assert torch.equal(part, full[s:s + m]), (dtype, m, s)
    head = exact_linear(x, w, out_dtype=torch.float32)  # the LM head's form: fp32 out
    assert torch.equal(exact_linear(x[37:38], w, out_dtype=torch.float32), head[37:38])


@pytest.mark.parametrize("bad, match", [
    (dict(x=torch.zeros(8)), "2-D"),
    (dict(x=torch.zeros(8, 2).t()), "stride"),
    (dict(weight=torch.zeros(5, 7)), r"\(N, 8\)"),
    (dict(weight=torch.zeros(5, 8, dtype=torch.float16)), "weight must be torch.float32"),
    (dict(bias=torch.zeros(4)), "bias"),
    (dict(out_dtype=torch.int32), "out_dtype"),
])
def test_exact_linear_bad_inputs(bad, match):
    args = {**dict(x=torch.zeros(2, 8), weight=torch.zeros(5, 8), bias=None, out_dtype=None), **bad}
    with pytest.raises(ValueError, match=match):
        exact_linear(**args)


# ---- the layer's small steps fused into the product ----------------------------------------

FUSED = {"norm": dict(norm=True), "silu": dict(silu=True), "residual": dict(residual=True),
         "norm+residual": dict(norm=True, residual=True), "silu+residual": dict(silu=True, residual=True)}


def fused_args(kind, M, K, N, dtype, seed):
    """x, weight and the keyword arguments of a fused product ``kind`` (a key of FUSED)."""
    opts = FUSED[kind]
    x = rand((M, 2 * K if opts.get("silu") else K), dtype, seed)
    kw = dict(silu=bool(opts.get("silu")))
    if opts.get("norm"):
        kw.update(norm=rand((K,), dtype, seed + 1, 0.5) + 1, eps=1e-5)
    if opts.get("residual"):
        kw.update(residual=rand((M, N), dtype, seed + 2))
    return x, rand((N, K), dtype, seed + 3, 0.1), kw


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("kind", list(FUSED))
@pytest.mark.parametrize("M, K, N, bias", [(1, 33, 17, False), (7, 200, 130, True), (20, 129, 65, True)])
def test_fused_steps_match_ref(dtype, kind, M, K, N, bias):
    x, w, kw = fused_args(kind, M, K, N, dtype, M + K)
    b = rand((N,), dtype, 7) if bias else None
    # 16-bit: the fused step's own rounding before the product may fall a step apart (the
    # interpreter truncates bf16), a step of each of the residual and the product after it
    tol = TOL[dtype] if dtype == torch.float32 else {k: 2 * v for k, v in TOL[dtype].items()}
    torch.testing.assert_close(exact_linear(x, w, b, **kw), exact_linear_ref(x, w, b, **kw), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_and_residual_fused_are_the_separate_kernels_bit_for_bit(dtype):
    """silu * up in the product's prologue is the silu_mul kernel's numbers, and the residual in
    its epilogue torch's add of the rounded product: bit for bit (bf16's add only natively: the
    interpreter truncates its casts where torch rounds)."""
    from kernels.backend import triton_interpreted
    from kernels.elementwise import silu_mul

    M, K, N = 9, 150, 70
    x, w, kw = fused_args("silu+residual", M, K, N, dtype, 5)
    assert torch.equal(exact_linear(x, w, silu=True), exact_linear(silu_mul(x), w))
    if dtype != torch.bfloat16 or not triton_interpreted():
        res = kw["residual"]
        assert torch.equal(exact_linear(x, w, silu=True, residual=res), res + exact_linear(silu_mul(x), w))
        y = rand((M, K), dtype, 6)
        assert torch.equal(exact_linear(y, w, residual=res), res + exact_linear(y, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind", ["norm", "silu+residual", "norm+residual"])
def test_a_fused_rows_product_does_not_depend_on_the_step(dtype, kind):
    """Every row of a 64-row fused product computed again in steps of 1 and 7 rows at offsets
    that put it at every place of a tile: the same bits (the norm's sum of squares included)."""
    bm, bn, bk = TILE[dtype]
    K, N = bk + 21, bn + 13
    x, w, kw = fused_args(kind, 64, K, N, dtype, 11)
    full = exact_linear(x, w, **kw)
    for m, starts in ((1, [0, 1, 15, 16, 47, 63]), (7, [0, 5, 13, 57])):
        for s in starts:
            part_kw = dict(kw, residual=kw["residual"][s:s + m]) if "residual" in kw else kw
            assert torch.equal(exact_linear(x[s:s + m], w, **part_kw), full[s:s + m]), (kind, m, s)


@pytest.mark.parametrize("bad, match", [
    (dict(silu=True), "2K"),
    (dict(x=torch.zeros(2, 16), silu=True, norm=torch.ones(8)), "norm and silu"),
    (dict(norm=torch.ones(7)), r"norm must be None or a contiguous \(8,\)"),
    (dict(residual=torch.zeros(2, 4)), r"residual must be None or a \(2, 5\)"),
    (dict(residual=torch.zeros(2, 5, dtype=torch.float16)), "residual"),
])
def test_fused_bad_inputs(bad, match):
    args = {**dict(x=torch.zeros(2, 8), weight=torch.zeros(5, 8)), **bad}
    if bad.get("silu") and "x" not in bad:
        args["x"] = torch.zeros(2, 9)
    with pytest.raises(ValueError, match=match):
        exact_linear(**args)


# ---- attention ----------------------------------------------------------------------------

N_HEADS, N_KV, HEAD_DIM, BLOCK = 4, 2, 32, 16


class Pool:
    """Sequences' keys, values and queries, laid into a paged cache (shuffled blocks, NaN where
    no sequence owns a slot) for one attention call."""

    def __init__(self, dtype, seed=0):
        self.dtype, self.g = dtype, torch.Generator().manual_seed(seed)

    def rand(self, *shape):
        return torch.randn(*shape, generator=self.g).to(self.dtype)

    def call(self, seqs, window=None, exact=True):
        """seqs: per sequence (k (L, n_kv, D), v, q (T, H, D), C, positions (T,), parents or None
        (None: causal)); returns the output rows (T_total, H, D)."""
        need = [-(-s[0].shape[0] // BLOCK) for s in seqs]
        n_blocks = sum(need) + 3
        perm = list(range(n_blocks))
        random.Random(len(seqs) + n_blocks).shuffle(perm)
        kc = torch.full((n_blocks, BLOCK, N_KV, HEAD_DIM), float("nan"), dtype=self.dtype)
        vc = kc.clone()
        tables = torch.full((len(seqs), max(need) + 1), -1, dtype=torch.int32)
        used, qs, pos, ctx, cu, masks, causal = 0, [], [], [], [0], [], []
        T_max = max(s[2].shape[0] for s in seqs)
        words = -(-T_max // 32)
        for b, ((k, v, q, C, p, parents), n) in enumerate(zip(seqs, need)):
            blocks = perm[used:used + n]
            used += n
            tables[b, :n] = torch.tensor(blocks, dtype=torch.int32)
            for j in range(k.shape[0]):
                kc[blocks[j // BLOCK], j % BLOCK], vc[blocks[j // BLOCK], j % BLOCK] = k[j], v[j]
            T = q.shape[0]
            qs.append(q), pos.append(p), ctx.append(C), cu.append(cu[-1] + T)
            m = torch.zeros(T, words * 32, dtype=torch.bool)
            if parents is not None:
                for i, par in enumerate(parents):
                    if par >= 0:
                        m[i] = m[par]
                    m[i, i] = True
            masks.append(pack_mask(m))
            causal.append(parents is None)
        tree = not all(causal)
        return tree_attention(torch.cat(qs), kc, vc, torch.tensor(cu, dtype=torch.int32),
                              torch.cat(pos).to(torch.int32), tables, torch.tensor(ctx, dtype=torch.int32),
                              mask=torch.cat(masks) if tree else None,
                              causal=torch.tensor(causal) if tree else None, sliding_window=window,
                              max_seqlen_q=T_max, exact=exact)


def tree_case(pool, C, parents):
    """A tree step over C committed keys, and for each node the decoding step that would hold it
    had its ancestors been accepted one by one: those as prefix (C + depth keys), the node alone."""
    T = len(parents)
    depth = [0] * T
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    prefix_k, prefix_v = pool.rand(C, N_KV, HEAD_DIM), pool.rand(C, N_KV, HEAD_DIM)
    k, v, q = pool.rand(T, N_KV, HEAD_DIM), pool.rand(T, N_KV, HEAD_DIM), pool.rand(T, N_HEADS, HEAD_DIM)
    tree = (torch.cat([prefix_k, k]), torch.cat([prefix_v, v]), q, C,
            torch.tensor([C + d for d in depth]), parents)
    decodes = []
    for i in range(T):
        chain, a = [], i
        while a >= 0:
            chain.append(a)
            a = parents[a]
        chain = chain[::-1]  # root .. i
        decodes.append((torch.cat([prefix_k, k[chain]]), torch.cat([prefix_v, v[chain]]), q[i:i + 1],
                        C + len(chain) - 1, torch.tensor([C + depth[i]]), None))
    return tree, decodes


def random_parents(T, seed):
    r = random.Random(seed)
    return [-1] + [r.randrange(i) for i in range(1, T)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("C, window", [(51, None), (130, 20)])
def test_a_tree_row_equals_its_decoding_step(dtype, C, window):
    """Each node of a tree step (alone, and in a ragged batch beside a prefill and a decode)
    gives the bits of the decoding step that holds it after its ancestors. A prefix of 51 puts
    the tree's keys across a 64-key tile boundary; with a window of 20 after 130 keys the first
    key tile lies outside every row's window (skipped) and the second partly."""
    pool = Pool(dtype, seed=1)
    parents = random_parents(24, 3)
    tree, decodes = tree_case(pool, C, parents)
    alone = pool.call([tree], window)
    others = [(pool.rand(30, N_KV, HEAD_DIM), pool.rand(30, N_KV, HEAD_DIM), pool.rand(30, N_HEADS, HEAD_DIM), 0,
               torch.arange(30), None),  # a prefill
              (pool.rand(90, N_KV, HEAD_DIM), pool.rand(90, N_KV, HEAD_DIM), pool.rand(1, N_HEADS, HEAD_DIM), 89,
               torch.tensor([89]), None)]  # a decode
    batched = pool.call([others[0], tree, others[1]], window)[30:30 + len(parents)]
    assert torch.equal(alone, batched)
    for i, d in enumerate(decodes):
        one = pool.call([d], window)
        assert torch.equal(alone[i:i + 1], one), (i, (alone[i].float() - one[0].float()).abs().max())
    ref = tree_attention_ref(*_ref_args(pool, tree), sliding_window=window)  # and the values are right
    torch.testing.assert_close(alone, ref, **TOL[dtype])


def _ref_args(pool, seq):
    """The reference's arguments for one sequence, laid out plainly (no paging games)."""
    k, v, q, C, p, parents = seq
    T, L = q.shape[0], k.shape[0]
    n = -(-L // BLOCK)
    kc = torch.zeros(n, BLOCK, N_KV, HEAD_DIM, dtype=pool.dtype)
    vc = torch.zeros_like(kc)
    kc.view(-1, N_KV, HEAD_DIM)[:L], vc.view(-1, N_KV, HEAD_DIM)[:L] = k, v
    m = torch.zeros(T, T, dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= 0:
            m[i] = m[par]
        m[i, i] = True
    return (q, kc, vc, torch.tensor([0, T], dtype=torch.int32), p.to(torch.int32),
            torch.arange(n, dtype=torch.int32)[None], torch.tensor([C], dtype=torch.int32), pack_mask(m))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_chain_row_equals_its_decoding_step(dtype):
    """Causal steps (several step tokens per program): each row of a 40-token chain after 100
    keys, and of a prefill, gives its decoding step's bits."""
    pool = Pool(dtype, seed=2)
    parents = [-1] + list(range(39))  # a chain, sent causal
    tree, decodes = tree_case(pool, 100, parents)
    chain = tree[:5] + (None,)
    out = pool.call([chain])
    for i in (0, 1, 13, 27, 39):
        assert torch.equal(out[i:i + 1], pool.call([decodes[i]])), i
    assert torch.equal(out, pool.call([tree]))  # the same chain under a mask: the same bits


def test_step_order_matches_ref():
    r = random.Random(0)
    T_s = [5, 1, 40, 33]
    rows = []
    for T in T_s:
        m = torch.zeros(T, 64, dtype=torch.bool)
        m[:, :T] = torch.rand(T, T, generator=torch.Generator().manual_seed(T)) < 0.4
        rows.append(m)
    mask = pack_mask(torch.cat(rows))
    mask[:, 1] |= 1 << r.randrange(31)  # bits past each sequence's T: not keys
    cu = torch.tensor([0] + T_s, dtype=torch.int32).cumsum(0).to(torch.int32)
    causal = torch.tensor([False, False, True, False])
    order, counts = step_order(mask, cu, max(T_s), causal)
    want_order, want_counts = step_order_ref(mask, cu, causal)
    live = torch.cat([torch.full((T,), not c, dtype=torch.bool) for T, c in zip(T_s, causal.tolist())])
    assert torch.equal(counts[live], want_counts[live])
    for row in live.nonzero().flatten().tolist():
        n = int(want_counts[row])
        assert torch.equal(order[row, :n], want_order[row, :n]), row


def test_exact_attention_refuses_splits_and_a_wrong_order_table():
    pool = Pool(torch.float32)
    tree, _ = tree_case(pool, 3, [-1, 0])
    args = _ref_args(pool, tree)
    with pytest.raises(ValueError, match="num_kv_splits"):
        tree_attention(*args[:7], num_kv_splits=2, exact=True)
    with pytest.raises(ValueError, match="key_order"):
        tree_attention(*args, exact=True, key_order=(torch.zeros(2, 31, dtype=torch.int32),
                                                     torch.zeros(2, dtype=torch.int32)))
