"""The hand-written CPU product for few rows (kernels/skinny.py) against its reference."""

import pytest
import torch

from kernels import rows as logit_rows, skinny

pytestmark = pytest.mark.skipif(not skinny.available(), reason=f"skinny kernel: {skinny.unavailable_reason()}")


@pytest.fixture(params=list(skinny.ISAS))
def isa(request):
    """Each build in turn (the active one switched for the test, then switched back); a build
    this CPU cannot run is skipped with the reason."""
    if request.param not in skinny.cpu_isas():
        pytest.skip(f"this CPU does not run {request.param} (flags: {', '.join(skinny.cpu_isas()) or 'neither'})")
    before = skinny.use_isa(request.param)
    yield request.param
    skinny.use_isa(before)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", [(1, 8), (7, 13), (37, 29), (96, 64), (131, 576)])
def test_matches_reference(n, k, bias, isa):
    """Random shapes: rows of W not a multiple of the tile, K not a multiple of 8, M from 0 to
    beyond the tiles, with and without bias."""
    g = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    for m in (0, 1, 2, 3, 4, 5, 7, 8, 13, 16, 33):
        x = torch.randn(m, k, generator=g)
        y = skinny.skinny_linear(x, w, b)
        assert y.shape == (m, n) and y.dtype == torch.float32 and y.is_contiguous()
        torch.testing.assert_close(y, skinny.skinny_linear_ref(x, w, b), atol=2e-5 * k ** 0.5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_row_does_not_depend_on_its_step(threads, isa):
    """Bit for bit: a row's result alone, inside any number of rows, at any place, and with any
    thread count is the same (a BLAS switches kernels with M and differs by rounding)."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(50, 99, generator=g), torch.randn(50, generator=g)
    x = torch.randn(17, 99, generator=g)
    alone = torch.cat([skinny.skinny_linear(x[i:i + 1], w, b, threads=1) for i in range(17)])
    for m in range(1, 18):
        for start in (0, 17 - m):
            assert torch.equal(skinny.skinny_linear(x[start:start + m], w, b, threads=threads), alone[start:start + m])


def test_the_two_builds_differ_only_by_rounding():
    """The same products in both builds: each close to the reference, and (16 lanes summed
    against 8) not bit for bit the other's, so a test run on one build says nothing of the other."""
    if len(skinny.cpu_isas()) < 2:
        pytest.skip(f"this CPU runs only {', '.join(skinny.cpu_isas())}")
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(64, 576, generator=g), torch.randn(9, 576, generator=g)
    before = skinny.isa()
    try:
        got = {}
        for name in ("avx2", "avx512"):
            skinny.use_isa(name)
            got[name] = skinny.skinny_linear(x, w)
    finally:
        skinny.use_isa(before)
    torch.testing.assert_close(got["avx2"], got["avx512"], atol=1e-4, rtol=1e-5)
    assert not torch.equal(got["avx2"], got["avx512"])


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_the_two_builds_attend_bit_for_bit_alike(half):
    """The decoding attention sums each score and each weighted value in one order on both builds:
    the AVX-512 build's 512-bit FMAs hold two keys' same 8 dimensions (scores) or 16 dimensions
    (values) a register, each lane the AVX2 build's operations. Rows, heads, keys and masks of
    several shapes, and head sizes with a tail of 8 dimensions (the value sums' 8-wide part)."""
    if len(skinny.cpu_isas()) < 2:
        pytest.skip(f"this CPU runs only {', '.join(skinny.cpu_isas())}")
    g = torch.Generator().manual_seed(11)
    before = skinny.isa()
    try:
        for t, h, kv, d, length, mode in ((1, 9, 3, 64, 300, "causal"), (8, 9, 3, 64, 515, "mask"),
                                          (5, 4, 2, 40, 77, "none"), (16, 6, 1, 128, 200, "causal"),
                                          (3, 8, 8, 96, 130, "mask")):
            bs = 16
            blocks = -(-length // bs)
            kc = torch.randn(blocks + 1, bs, kv, d, generator=g)
            vc = torch.randn(blocks + 1, bs, kv, d, generator=g)
            if half:
                kc, vc = kc.half(), vc.half()
            ids = torch.randperm(blocks + 1, generator=g)[:blocks].to(torch.int32)
            q = torch.randn(t, h, d, generator=g)
            mask = None
            if mode == "mask":
                mask = torch.rand(t, length, generator=g) < 0.6
            got = {}
            for name in ("avx2", "avx512"):
                skinny.use_isa(name)
                got[name] = skinny.skinny_attention(q, kc, vc, ids, length, mask=mask, causal=mode == "causal")
            assert torch.equal(got["avx2"], got["avx512"]), (t, h, kv, d, length, mode)
    finally:
        skinny.use_isa(before)


def test_the_instruction_set_is_chosen_from_the_cpu_and_the_environment(monkeypatch):
    monkeypatch.setattr(skinny, "cpu_isas", lambda: ["avx2", "avx512"])
    monkeypatch.delenv("SPECDEC_CPU_ISA", raising=False)
    assert skinny._chosen_isa() == ("avx512", None)  # the widest
    monkeypatch.setenv("SPECDEC_CPU_ISA", "AVX2")
    assert skinny._chosen_isa() == ("avx2", None)
    monkeypatch.setenv("SPECDEC_CPU_ISA", "avx1024")
    assert skinny._chosen_isa()[1] == "SPECDEC_CPU_ISA must be one of avx2, avx512, got 'avx1024'"
    monkeypatch.setattr(skinny, "cpu_isas", lambda: ["avx2"])
    monkeypatch.setenv("SPECDEC_CPU_ISA", "avx512")
    assert skinny._chosen_isa()[1] == "SPECDEC_CPU_ISA=avx512, but this CPU runs only avx2"
    monkeypatch.delenv("SPECDEC_CPU_ISA")
    assert skinny._chosen_isa() == ("avx2", None)
    with pytest.raises(ValueError, match="does not run avx512"):
        skinny.use_isa("avx512")
    with pytest.raises(ValueError, match="isa must be one of"):
        skinny.use_isa("sse2")


def test_cpu_isas_reads_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(skinny, "cpu_flags", lambda: {"avx2", "fma", "avx512f", "avx512dq", "avx512bw"})
    assert skinny.cpu_isas() == ["avx2"]  # no avx512vl: not the 512-bit build
    monkeypatch.setattr(skinny, "cpu_flags", lambda: {"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"})
    assert skinny.cpu_isas() == ["avx2", "avx512"]
    monkeypatch.setattr(skinny, "cpu_flags", lambda: {"sse4_2"})
    assert skinny.cpu_isas() == []


def test_roofline_probes():
    """Rates, not timings: positive, and the arguments checked (the values are the machine's)."""
    assert skinny.fma_peak_gflops(256, threads=1, iters=100_000) > 0
    if "avx512f" in skinny.cpu_flags():
        assert skinny.fma_peak_gflops(512, threads=1, iters=100_000) > 0
    with pytest.raises(ValueError, match="bits must be 256 or 512"):
        skinny.fma_peak_gflops(128)
    assert skinny.read_bandwidth_gbs(torch.ones(1 << 20), threads=2) > 0
    with pytest.raises(ValueError, match="buffer"):
        skinny.read_bandwidth_gbs(torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="buffer must hold at least 1024 floats"):
        skinny.read_bandwidth_gbs(torch.ones(8))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be None or an int >= 1"):
            skinny.fma_peak_gflops(256, threads=bad, iters=10)
        with pytest.raises(ValueError, match="threads must be None or an int >= 1"):
            skinny.read_bandwidth_gbs(torch.ones(1 << 12), threads=bad)
    with pytest.raises(ValueError, match="iters must be an int >= 1"):
        skinny.fma_peak_gflops(256, iters=0)


def test_bad_input_is_named():
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="same K"):
        skinny.skinny_linear(torch.randn(2, 15), w)
    with pytest.raises(ValueError, match="x must be a contiguous float32"):
        skinny.skinny_linear(torch.randn(2, 16, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="weight must be .*not contiguous"):
        skinny.skinny_linear(torch.randn(2, 16), torch.randn(16, 8).t())
    with pytest.raises(ValueError, match="buffer must be a contiguous float32 CPU tensor, got int 256"):
        skinny.read_bandwidth_gbs(256)  # a size where a tensor goes: named, not an AttributeError
    with pytest.raises(ValueError, match=r"bias must be \(8,\)"):
        skinny.skinny_linear(torch.randn(2, 16), w, torch.randn(7))
    with pytest.raises(ValueError, match="threads must be >= 1"):
        skinny.skinny_linear(torch.randn(2, 16), w, threads=0)


def test_build_failure_leaves_it_unavailable(monkeypatch, tmp_path):
    """No compiler (or a failing one): unavailable with the reason, and the tuner then does not
    offer the form; nothing raises at import or at load."""
    monkeypatch.setattr(skinny, "_tried", False)
    monkeypatch.setattr(skinny, "_lib", None)
    monkeypatch.setattr(skinny, "_reason", None)
    monkeypatch.setattr(skinny, "_built", {})  # nothing built in this process either
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")  # "compiles" nothing
    assert not skinny.available()
    assert "could not build" in skinny.unavailable_reason()
    with pytest.raises(RuntimeError, match="unavailable"):
        skinny.skinny_linear(torch.randn(1, 8), torch.randn(4, 8))
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


# ---- attention of a few rows over a paged cache -------------------------------------------------
def dense_attention(q, k_cache, v_cache, block_ids, length, mask, causal, scale):
    """The definition, in float64 on gathered keys: softmax(q k^T * scale, hidden keys out) v."""
    t, h, d = q.shape
    kv = k_cache.shape[2]
    k = k_cache[block_ids.long()].reshape(-1, kv, d)[:length].repeat_interleave(h // kv, 1).double()
    v = v_cache[block_ids.long()].reshape(-1, kv, d)[:length].repeat_interleave(h // kv, 1).double()
    vis = mask if mask is not None else torch.ones(t, length, dtype=torch.bool)
    if causal and mask is None:
        vis = vis.tril(length - t)
    s = torch.einsum("thd,lhd->htl", q.double(), k) * scale
    p = torch.softmax(s.masked_fill(~vis[None], float("-inf")), -1).nan_to_num(0.0)  # no visible key: zeros
    return torch.einsum("htl,lhd->thd", p, v).float()


@pytest.mark.parametrize("t,h,kv,d,length,bs", [(1, 9, 3, 64, 300, 16), (5, 4, 2, 16, 37, 4), (17, 6, 1, 24, 70, 8),
                                               (3, 8, 8, 128, 9, 16), (2, 2, 1, 264, 50, 16)])
@pytest.mark.parametrize("mode", ["all", "mask", "causal"])
def test_attention_matches_reference(t, h, kv, d, length, bs, mode, isa):
    """GQA groups of 1 to 6, head dims 16 to 264 (also not a multiple of 32 or 64, and past the
    kernel's 256-float buffer), step queries that fill the kernel's blocks of 3 and that do not, shuffled blocks,
    a partial last block, strided q rows (a slice of a fused q/k/v tensor), random masks with
    a row that sees nothing. On each build."""
    g = torch.Generator().manual_seed(t * 100 + length)
    n = -(-length // bs)
    k_cache, v_cache = torch.randn(n + 3, bs, kv, d, generator=g), torch.randn(n + 3, bs, kv, d, generator=g)
    ids = torch.randperm(n + 3, generator=g)[:n].int()
    q = torch.randn(t, h + 2 * kv, d, generator=g)[:, :h]
    mask = None
    if mode == "mask":
        mask = torch.rand(t, length, generator=g) < 0.6
        mask[0] = False
    out = skinny.skinny_attention(q, k_cache, v_cache, ids, length, mask, mode == "causal", 0.2)
    torch.testing.assert_close(out, dense_attention(q, k_cache, v_cache, ids, length, mask, mode == "causal", 0.2),
                               atol=1e-5, rtol=1e-5)
    if mask is not None:
        assert (out[0] == 0).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("length", [40, 200])  # one key split, four (the last one short)
def test_attention_row_does_not_depend_on_its_step(threads, length, isa):
    """A row's output is bit for bit the same alone, in a step of 16 rows, at any place in it,
    with any thread count: a method that sends more rows cannot flip a greedy token. Row 0
    sees only keys of the last split, row 1 none."""
    g = torch.Generator().manual_seed(3 + length)
    n = -(-length // 8)
    k_cache, v_cache = torch.randn(n + 2, 8, 2, 32, generator=g), torch.randn(n + 2, 8, 2, 32, generator=g)
    ids = torch.randperm(n + 2, generator=g)[:n].int()
    q = torch.randn(16, 4, 32, generator=g)
    mask = torch.rand(16, length, generator=g) < 0.8
    mask[0, :length - 5] = False
    mask[1] = False
    together = skinny.skinny_attention(q, k_cache, v_cache, ids, length, mask, threads=threads)
    torch.testing.assert_close(together, dense_attention(q, k_cache, v_cache, ids, length, mask, False, 32 ** -0.5),
                               atol=1e-5, rtol=1e-5)
    for i in range(16):
        alone = skinny.skinny_attention(q[i:i + 1], k_cache, v_cache, ids, length, mask[i:i + 1], threads=1)
        assert torch.equal(alone, together[i:i + 1])
    assert torch.equal(skinny.skinny_attention(q[5:9], k_cache, v_cache, ids, length, mask[5:9], threads=threads),
                       together[5:9])
    # causal: row t of a T-row step sees keys <= t + length - T, the same as with its mask row
    tril = torch.ones(16, length, dtype=torch.bool).tril(length - 16)
    assert torch.equal(skinny.skinny_attention(q, k_cache, v_cache, ids, length, None, True, threads=threads),
                       skinny.skinny_attention(q, k_cache, v_cache, ids, length, tril, threads=threads))


@pytest.mark.parametrize("h,kv", [(9, 3), (4, 4), (12, 2)])
def test_a_rows_numbers_do_not_depend_on_how_many_queries_a_task_moves_at_once(h, kv, isa):
    """The kernel moves a task's (row, head) queries 3 at a time, or 6 at a time where the build
    has 32 vector registers and the task has 6 or more: the last row of a causal step of 1, 2, 3
    and 8 rows (3 to 48 queries a task) sees every key, as one row alone does, and gets the same
    bits, over one split and over several."""
    g = torch.Generator().manual_seed(h * 10 + kv)
    for length in (50, 300):
        n = -(-length // 16)
        k_cache, v_cache = torch.randn(n, 16, kv, 64, generator=g), torch.randn(n, 16, kv, 64, generator=g)
        ids = torch.randperm(n, generator=g).int()
        q = torch.randn(8, h, 64, generator=g)
        alone = skinny.skinny_attention(q[-1:], k_cache, v_cache, ids, length, None, True)
        for t in (2, 3, 8):
            out = skinny.skinny_attention(q[-t:], k_cache, v_cache, ids, length, None, True)
            assert torch.equal(out[-1:], alone)


@pytest.mark.parametrize("t", [1, 6])
def test_attention_is_the_same_whatever_the_threads_range_over(t, isa):
    """Each thread takes a contiguous range of (split, kv head) tasks and requests the keys of
    its task two ahead while it computes one: 1,000 keys (16 splits, 3 kv heads: 48 tasks) cut
    into 1, 2, 3, 5 and 7 ranges, most of them not a multiple of the kv heads, so that ranges
    start and end inside a split and the two-ahead request runs off a range's end. Every count
    gives the same bits, and the reference's numbers."""
    g = torch.Generator().manual_seed(11 + t)
    length, bs, kv = 1000, 16, 3
    n = -(-length // bs)
    k_cache, v_cache = torch.randn(n + 2, bs, kv, 64, generator=g), torch.randn(n + 2, bs, kv, 64, generator=g)
    ids = torch.randperm(n + 2, generator=g)[:n].int()
    q = torch.randn(t, 9, 64, generator=g)
    mask = torch.ones(t, length, dtype=torch.bool)
    mask[:, length - t:] = torch.rand(t, t, generator=g) < 0.5
    mask[:, length - t:] |= torch.eye(t, dtype=torch.bool)
    one = skinny.skinny_attention(q, k_cache, v_cache, ids, length, mask, threads=1)
    torch.testing.assert_close(one, dense_attention(q, k_cache, v_cache, ids, length, mask, False, 64 ** -0.5),
                               atol=1e-5, rtol=1e-5)
    for threads in (2, 3, 5, 7):
        assert torch.equal(skinny.skinny_attention(q, k_cache, v_cache, ids, length, mask, threads=threads), one)


def random_tree_mask(g, ctx, t):
    """A step of t rows after ctx context keys, as a tree: row i's parent a random earlier row (or
    none: a root), and it sees the context, its ancestors and itself. -> (t, ctx + t) bool."""
    mask = torch.zeros(t, ctx + t, dtype=torch.bool)
    mask[:, :ctx] = True
    for i in range(t):
        parent = int(torch.randint(-1, i, (1,), generator=g)) if i else -1
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, ctx + i] = True
    return mask


def as_a_chain(q, k_cache, v_cache, ids, length, mask, bs, threads):
    """Each row alone over a cache that holds exactly its visible keys, in their order, at places
    0 .. V - 1, the row a causal last row (what a chain of those keys gives it)."""
    kv, d = k_cache.shape[2], k_cache.shape[3]
    k = k_cache[ids.long()].reshape(-1, kv, d)[:length]
    v = v_cache[ids.long()].reshape(-1, kv, d)[:length]
    rows = []
    for i in range(q.shape[0]):
        keys = mask[i].nonzero().flatten()
        if len(keys) == 0:
            rows.append(torch.zeros(1, q.shape[1], d))
            continue
        n = -(-len(keys) // bs)
        kc, vc = torch.zeros(n * bs, kv, d), torch.zeros(n * bs, kv, d)
        kc[:len(keys)], vc[:len(keys)] = k[keys], v[keys]
        rows.append(skinny.skinny_attention(q[i:i + 1], kc.view(n, bs, kv, d), vc.view(n, bs, kv, d),
                                            torch.arange(n, dtype=torch.int32), len(keys), None, True, 0.3,
                                            threads=threads))
    return torch.cat(rows)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("ctx", [0, 5, 63, 64, 70, 130])
def test_a_tree_row_sums_its_visible_keys_as_a_chain_would(ctx, threads, isa):
    """Bit for bit: a tree row's output is the output of the same query over a cache holding
    only its visible keys, contiguous (its splits follow the keys' ranks, not their places), so
    a branch accepted from a tree leaves the K/V a chain of its tokens would. Random trees of up
    to 40 rows after contexts that end before, at and after split boundaries; also random masks
    that hide context keys, and a row that sees nothing."""
    g = torch.Generator().manual_seed(100 * ctx + threads)
    bs, kv = 8, 3
    for t in (1, 2, 7, 16, 40):
        length = ctx + t
        n = -(-length // bs)
        k_cache, v_cache = torch.randn(n + 3, bs, kv, 64, generator=g), torch.randn(n + 3, bs, kv, 64, generator=g)
        ids = torch.randperm(n + 3, generator=g)[:n].int()
        q = torch.randn(t, 9, 64, generator=g)
        masks = [random_tree_mask(g, ctx, t), torch.rand(t, length, generator=g) < 0.7]
        masks[1][0] = False
        for mask in masks:
            out = skinny.skinny_attention(q, k_cache, v_cache, ids, length, mask, scale=0.3, threads=threads)
            assert torch.equal(out, as_a_chain(q, k_cache, v_cache, ids, length, mask, bs, 1))
            torch.testing.assert_close(out, dense_attention(q, k_cache, v_cache, ids, length, mask, False, 0.3),
                                       atol=1e-5, rtol=1e-5)


def test_attention_bad_input_is_named():
    kc = torch.randn(4, 8, 2, 16)
    q = torch.randn(2, 4, 16)
    ids = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim must match"):
        skinny.skinny_attention(torch.randn(2, 4, 8), kc, kc, ids, 10)
    with pytest.raises(ValueError, match="block_ids must lie in \\[0, 4\\)"):
        skinny.skinny_attention(q, kc, kc, torch.tensor([0, 9], dtype=torch.int32), 10)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        skinny.skinny_attention(q, kc, kc, ids[:1], 10)
    with pytest.raises(ValueError, match="int32"):
        skinny.skinny_attention(q, kc, kc, ids.long(), 10)
    with pytest.raises(ValueError, match=r"mask must be a contiguous bool \(2, 10\)"):
        skinny.skinny_attention(q, kc, kc, ids, 10, torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="length must be >= 1"):
        skinny.skinny_attention(q, kc, kc, ids, 0)
    with pytest.raises(ValueError, match="float32"):
        skinny.skinny_attention(q.double(), kc, kc, ids, 10)


@pytest.mark.parametrize("t,h,kv,d,length,bs", [(1, 9, 3, 64, 300, 16), (5, 4, 2, 16, 37, 4), (17, 6, 1, 24, 70, 8),
                                               (2, 2, 1, 264, 50, 16)])
@pytest.mark.parametrize("mode", ["mask", "causal"])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_over_fp16_caches_is_the_fp32_kernel_over_the_same_numbers(t, h, kv, d, length, bs, mode, threads,
                                                                             isa):
    """fp16 pools (the quantized path's KV cache) are widened exactly: every output is bit for
    bit the fp32 kernel's over fp32 pools holding the same numbers, whatever the mask, the rows
    and the threads. So the fp16 cache keeps every property the fp32 kernel is tested for."""
    if not skinny.kv16_available():
        pytest.skip("this build has no F16C")
    g = torch.Generator().manual_seed(t * 7 + length)
    n = -(-length // bs)
    k16 = torch.randn(n + 3, bs, kv, d, generator=g).half()
    v16 = torch.randn(n + 3, bs, kv, d, generator=g).half()
    ids = torch.randperm(n + 3, generator=g)[:n].int()
    q = torch.randn(t, h + 2 * kv, d, generator=g)[:, :h]
    mask = torch.rand(t, length, generator=g) < 0.6 if mode == "mask" else None
    args = (ids, length, mask, mode == "causal", 0.2, threads)
    got = skinny.skinny_attention(q, k16, v16, *args)
    assert torch.equal(got, skinny.skinny_attention(q, k16.float(), v16.float(), *args))


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_batch_attended_in_one_call_is_each_sequence_attended_alone(half, threads, isa):
    """``skinny_attention_seqs`` (the layer stack's: every sequence's tasks in one list, one
    parallel region) gives each row, bit for bit, what ``skinny_attention`` gives its sequence
    alone: twelve sequences in one pool, 0-6 rows each (a sequence of none adds nothing), 1-700
    keys, under a mask, the causal rule or neither; fp32 and fp16 pools, 1-3 threads."""
    import ctypes

    if half and not skinny.kv16_available():
        pytest.skip("this build has no F16C")
    lib = skinny._require()
    g = torch.Generator().manual_seed(3 + threads + 10 * half)
    H, KV, D, bs = 4, 2, 16, 8
    rows = [3, 1, 0, 6, 2, 1, 5, 1, 4, 2, 1, 3]
    lengths = [5, 1, 9, 700, 64, 65, 130, 300, 17, 200, 33, 450]
    modes = ["mask", None, "causal", "mask", "causal", None, "mask", None, "causal", "mask", None, "causal"]
    n_blocks = sum(-(-L // bs) for L in lengths) + 4
    k = torch.randn(n_blocks, bs, KV, D, generator=g)
    v = torch.randn(n_blocks, bs, KV, D, generator=g)
    if half:
        k, v = k.half(), v.half()
    order = torch.randperm(n_blocks, generator=g).int()
    ids, used = [], 0
    for L in lengths:
        ids.append(order[used:used + -(-L // bs)].contiguous())
        used += -(-L // bs)
    R = sum(rows)
    qkv = torch.randn(R, H + 2 * KV, D, generator=g)  # q is each row's first H heads, as in the stack
    masks = [(torch.rand(t, L, generator=g) < 0.6) if m == "mask" else None for t, L, m in zip(rows, lengths, modes)]
    start = [0]
    for t in rows:
        start.append(start[-1] + t)
    alone = torch.cat([skinny.skinny_attention(qkv[a:b, :H], k, v, i, L, m, mode == "causal", 0.2, threads)
                       for a, b, i, L, m, mode in zip(start, start[1:], ids, lengths, masks, modes) if b > a])
    out = torch.full((R, H, D), float("nan"))
    mask_bytes = [None if m is None else m.to(torch.uint8).contiguous() for m in masks]
    n = len(rows)
    rc = lib.skinny_attention_seqs(
        n, qkv.data_ptr(), (H + 2 * KV) * D, (ctypes.c_int32 * (n + 1))(*start), H, KV, D, k.data_ptr(),
        v.data_ptr(), (ctypes.c_void_p * n)(*[i.data_ptr() for i in ids]), bs, (ctypes.c_int64 * n)(*lengths),
        (ctypes.c_void_p * n)(*[None if m is None else m.data_ptr() for m in mask_bytes]),
        (ctypes.c_uint8 * n)(*[mode == "causal" for mode in modes]), 0.2, out.data_ptr(), threads, int(half))
    assert rc == 0
    assert torch.equal(out.reshape(R, H * D), alone.reshape(R, H * D))


@pytest.mark.parametrize("t,prefix", [(1, 0), (7, 50), (130, 0), (45, 13)])
def test_prefill_over_fp16_caches_is_the_fp32_kernel_over_the_same_numbers(t, prefix, isa):
    if not skinny.kv16_available():
        pytest.skip("this build has no F16C")
    g = torch.Generator().manual_seed(t + prefix)
    k_cache, v_cache, ids = paged(g, prefix + t, 16, 3, 64)
    k16, v16 = k_cache.half(), v_cache.half()
    q = torch.randn(t, 15, 64, generator=g)[:, :9]
    got = skinny.prefill_attention(q, k16, v16, ids, prefix + t, 0.2)
    assert torch.equal(got, skinny.prefill_attention(q, k16.float(), v16.float(), ids, prefix + t, 0.2))


def test_attention_cache_dtypes_are_named():
    q, ids = torch.randn(2, 4, 16), torch.tensor([0, 1], dtype=torch.int32)
    kc = torch.randn(4, 8, 2, 16)
    for k, v in ((kc.bfloat16(), kc.bfloat16()), (kc.half(), kc), (kc, kc.double())):
        with pytest.raises(ValueError, match="k_cache's dtype|v_cache must be|k_cache must be"):
            skinny.skinny_attention(q, k, v, ids, 10)


# ---- elementwise steps of the forward ----------------------------------------------------------
def paged(g, length, bs, kv, d, spare=3):
    """Random caches with the sequence's blocks shuffled among spare ones, and its int32 ids."""
    n = -(-length // bs)
    k_cache, v_cache = torch.randn(n + spare, bs, kv, d, generator=g), torch.randn(n + spare, bs, kv, d, generator=g)
    return k_cache, v_cache, torch.randperm(n + spare, generator=g)[:n].int()


@pytest.mark.parametrize("t,h,kv,d,prefix,bs", [
    (1, 9, 3, 64, 0, 16),  # one row
    (7, 9, 3, 64, 50, 16),  # a few rows after a prefix
    (130, 9, 3, 64, 0, 16),  # the default model's group; rows past a 128-key chunk
    (300, 4, 1, 64, 200, 8),  # tasks of 3 rows x 4 heads, chunks cut inside a row block
    (45, 14, 2, 64, 0, 16),  # Qwen2.5-0.5B's group of 7: tasks of 2 rows, 14 queries (a short score tile)
    (70, 12, 2, 128, 61, 16),  # group of 6, head dim 128
    (20, 32, 1, 64, 3, 4),  # group of 32: one row a task, the most queries
    (33, 8, 8, 64, 0, 16),  # no GQA: tasks of 12 rows, the last short
])
def test_prefill_attention_matches_reference(t, h, kv, d, prefix, bs, isa):
    """The causal rule after a prefix (row t sees keys <= prefix + t), in float64 on gathered
    keys, on each build: groups of 1 to 32 query heads, head dims 64 and 128, rows that fill the
    tasks and chunks and rows that do not, shuffled blocks with a partial last one, strided q
    rows (a slice of a fused q/k/v tensor)."""
    g = torch.Generator().manual_seed(t * 100 + prefix)
    length = prefix + t
    k_cache, v_cache, ids = paged(g, length, bs, kv, d)
    q = torch.randn(t, h + 2 * kv, d, generator=g)[:, :h]
    out = skinny.prefill_attention(q, k_cache, v_cache, ids, length, 0.2)
    assert out.shape == (t, h, d) and out.is_contiguous()
    torch.testing.assert_close(out, dense_attention(q, k_cache, v_cache, ids, length, None, True, 0.2),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prefill_row_does_not_depend_on_its_chunk(threads, isa):
    """Bit for bit: a row's output is the same in a prompt of 300 rows as the last row of a
    shorter one with the same keys before it (a prompt prefilled in chunks, or after a
    prefix), with any thread count; and the skinny kernel's causal rule gives the reference's
    numbers for the same rows."""
    g = torch.Generator().manual_seed(5)
    prefix, t = 40, 300
    k_cache, v_cache, ids = paged(g, prefix + t, 16, 3, 64)
    q = torch.randn(t, 9, 64, generator=g)
    whole = skinny.prefill_attention(q, k_cache, v_cache, ids, prefix + t, threads=threads)
    for r in (0, 1, 11, 12, 127, 128, 200, 299):
        part = skinny.prefill_attention(q[:r + 1], k_cache, v_cache, ids, prefix + r + 1, threads=1)
        assert torch.equal(part[r], whole[r])
        tail = skinny.prefill_attention(q[r:], k_cache, v_cache, ids, prefix + t, threads=threads)
        assert torch.equal(tail[0], whole[r])
    torch.testing.assert_close(whole[-16:], skinny.skinny_attention(q[-16:], k_cache, v_cache, ids, prefix + t,
                                                                     None, True), atol=1e-5, rtol=1e-5)


def test_prefill_attention_bad_input_is_named():
    kc = torch.randn(4, 8, 2, 64)
    q = torch.randn(5, 4, 64)
    ids = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim must match"):
        skinny.prefill_attention(torch.randn(5, 4, 8), kc, kc, ids, 10)
    with pytest.raises(ValueError, match="at most 32 per kv head"):
        skinny.prefill_attention(torch.randn(5, 66, 64), kc, kc, ids, 10)
    with pytest.raises(ValueError, match="length must be >= T"):
        skinny.prefill_attention(q, kc, kc, ids, 4)
    with pytest.raises(ValueError, match="block_ids must lie in \\[0, 4\\)"):
        skinny.prefill_attention(q, kc, kc, torch.tensor([0, 9], dtype=torch.int32), 10)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        skinny.prefill_attention(q, kc, kc, ids[:1], 10)
    with pytest.raises(ValueError, match="float32 CPU"):
        skinny.prefill_attention(q.double(), kc, kc, ids, 10)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        skinny.prefill_attention(q, kc, kc, ids, 10, threads=0)
    for scale in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            skinny.prefill_attention(q, kc, kc, ids, 10, scale)


@pytest.mark.parametrize("n", [1, 7, 8, 29, 576])
def test_rms_norm_matches_torch(n):
    g = torch.Generator().manual_seed(n)
    for rows in (1, 3, 16):
        x = torch.randn(rows, n, generator=g) * torch.logspace(-3, 3, rows)[:, None]
        w = torch.randn(n, generator=g)
        torch.testing.assert_close(skinny.rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (n,), w, 1e-6),
                                   atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 8, 29, 1536])
def test_silu_mul_matches_torch(n):
    """Large positive and negative gates included (the sigmoid must not overflow)."""
    g = torch.Generator().manual_seed(n)
    gu = torch.randn(4, 2 * n, generator=g) * torch.tensor([1.0, 10.0, 50.0, 100.0])[:, None]
    gate, up = gu.chunk(2, -1)
    ref = torch.nn.functional.silu(gate) * up
    out = skinny.silu_mul(gu)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_elementwise_ops_are_bit_for_bit_alike_across_builds_threads_and_rows():
    """RMSNorm and SiLU-mul give every element the same numbers on both builds (the AVX-512 build's
    16 lanes each the AVX2 build's operations), with their rows shared between 1 to 3 threads or
    on one, and for a row alone or among others: widths with 16-, 8- and 1-wide tails, calls past
    and below the sizes from which the threads share the rows (33 x 576 and more for RMSNorm),
    gates that overflow a naive sigmoid."""
    g = torch.Generator().manual_seed(3)
    before = skinny.isa()
    builds = [b for b in ("avx2", "avx512") if b in skinny.cpu_isas()]
    try:
        for n in (576, 1536, 29, 24, 1):
            x = torch.randn(33, n, generator=g) * torch.logspace(-2, 2, 33)[:, None]
            w = torch.randn(n, generator=g)
            gu = torch.randn(33, 2 * n, generator=g) * 60.0
            norms, silus = [], []
            for name in builds:
                skinny.use_isa(name)
                for threads in (1, 2, 3):
                    norms.append(skinny.rms_norm(x, w, 1e-6, threads=threads))
                    silus.append(skinny.silu_mul(gu, threads=threads))
                # each row alone: what a one-token step computes
                norms.append(torch.cat([skinny.rms_norm(x[r:r + 1], w, 1e-6) for r in range(33)]))
                silus.append(torch.cat([skinny.silu_mul(gu[r:r + 1]) for r in range(33)]))
            for a in norms[1:]:
                assert torch.equal(norms[0], a), n
            for a in silus[1:]:
                assert torch.equal(silus[0], a), n
            assert torch.isfinite(silus[0]).all()
    finally:
        skinny.use_isa(before)
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        skinny.silu_mul(torch.randn(2, 8), threads=0)
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        skinny.rms_norm(torch.randn(2, 8), torch.randn(8), 1e-6, threads=True)


def test_elementwise_bad_input_is_named():
    with pytest.raises(ValueError, match=r"weight \(n,\)"):
        skinny.rms_norm(torch.randn(2, 8), torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        skinny.rms_norm(torch.randn(2, 8), torch.randn(8), -1.0)
    with pytest.raises(ValueError, match="x must be a contiguous float32"):
        skinny.rms_norm(torch.randn(8, 2).t(), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match=r"gate_up must be \(rows, 2n\)"):
        skinny.silu_mul(torch.randn(2, 7))


@pytest.mark.parametrize("heads,d", [(1, 16), (6, 64), (3, 128)])
def test_rope_is_bit_for_bit_apply_rope(heads, d):
    """In place on the q and k heads of fused q/k/v rows (strided), v untouched, the same bits
    as the torch expression it replaces."""
    from models.llama import apply_rope, rope_tables

    g = torch.Generator().manual_seed(heads * d)
    t = 7
    qkv = torch.randn(t, (heads + 2) * d, generator=g) * 50
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_tables(torch.tensor([0, 3, 3, 4, 900, 901, 5000], dtype=torch.int32), inv_freq, torch.float32)
    want = apply_rope(qkv[:, :heads * d].view(t, heads, d), cos, sin)
    x = qkv.clone()
    assert skinny.rope_(x, cos.view(t, d), sin.view(t, d), heads) is x
    assert torch.equal(x[:, :heads * d].view(t, heads, d), want)
    assert torch.equal(x[:, heads * d:], qkv[:, heads * d:])
    wide = torch.zeros(t, x.shape[1] + 5)
    wide[:, :x.shape[1]] = qkv
    skinny.rope_(wide[:, :x.shape[1]], cos.view(t, d), sin.view(t, d), heads)  # rows strided
    assert torch.equal(wide[:, :x.shape[1]], x)


def test_rope_bad_input_is_named():
    cos = torch.randn(2, 16)
    with pytest.raises(ValueError, match="D must be a multiple of 16"):
        skinny.rope_(torch.randn(2, 24), torch.randn(2, 12), torch.randn(2, 12), 1)
    with pytest.raises(ValueError, match=r"heads \* D at most the row \(32\)"):
        skinny.rope_(torch.randn(2, 32), cos, cos, 3)
    with pytest.raises(ValueError, match=r"cos, sin \(rows, D\)"):
        skinny.rope_(torch.randn(3, 32), cos, cos, 1)
    with pytest.raises(ValueError, match="float32"):
        skinny.rope_(torch.randn(2, 32).double(), cos, cos, 1)


def all_skinny(model):
    """``model`` with every product planned ``skinny`` at every row bucket (the whole-stack path's
    condition), returned for chaining."""
    from models.linear import BUCKETS, ProductPlan
    for layer in model.layers:
        for lin in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            lin.plan = ProductPlan(["skinny"] * len(BUCKETS))
    return model


def test_forward_with_and_without_the_kernels(monkeypatch, isa):
    """The tiny model's logits with every CPU kernel (products, attention, norms, SiLU) and
    with none of them agree to float rounding."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.runner import ModelRunner, StepInput

    model = ours_from_hf(tiny_hf_model("llama", seed=5)).model
    model.head_plan = None

    def logits():
        runner = ModelRunner(model, cache_tokens=64)
        runner.add_sequence(0)
        first = runner.step([StepInput(0, [3, 4, 5, 6, 7])])[0]
        runner.commit({0: [0, 1, 2, 3, 4]})
        return torch.cat([first, runner.step([StepInput(0, [8])])[0], runner.step([StepInput(0, [9, 10])])[0]])

    all_skinny(model)
    with_kernels = logits()
    for layer in model.layers:
        for lin in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            lin.plan = None
    monkeypatch.setattr(skinny, "available", lambda: False)
    torch.testing.assert_close(with_kernels, logits(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_whole_stack_call_is_bit_for_bit_the_per_op_path(monkeypatch, arch, isa):
    """Every layer in one C call (a ragged batch: one sequence with a tree mask, one causal, some
    of its rows' logits asked for) gives the same logits and the same cache, bit for bit, as the
    per-op forward, and runs (the final norm of the rows asked for in the same call)."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.llama import Transformer
    from models.runner import ModelRunner, StepInput

    model = all_skinny(ours_from_hf(tiny_hf_model(arch, seed=7)).model)
    assert model.cfg.head_dim % 16 == 0
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                        dtype=torch.bool)

    def run():
        runner = ModelRunner(model, cache_tokens=256)
        for sid, prompt in ((0, list(range(3, 40))), (1, [5, 6, 7, 8])):
            runner.add_sequence(sid)
            runner.step([StepInput(sid, prompt)])
            runner.commit({sid: list(range(len(prompt)))})
        out = runner.step([StepInput(0, [9, 10, 11, 12, 13], [0, 1, 1, 2, 2], tree),
                           StepInput(1, [14, 15, 16], logits_rows=[2, 0])])
        return torch.cat(out), runner.cache.k.clone(), runner.cache.v.clone()

    calls = []
    real = skinny.layers_unchecked
    monkeypatch.setattr(skinny, "layers_unchecked", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    stacked = run()
    assert 8 in calls  # the decode step went through the one call
    monkeypatch.setattr(Transformer, "_whole_stack", lambda *a: None)
    per_op = run()
    for a, b in zip(stacked, per_op):
        assert torch.equal(a, b)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_whole_stack_attends_a_ragged_batch_in_one_call_bit_for_bit(monkeypatch, threads):
    """The stack attends every sequence of a step in one call (one task list, one parallel region):
    four sequences of 1-5 rows over 21-153 keys (shared splits and rows' own under a tree's mask,
    a causal chain, single tokens, one sequence's keys in more blocks than the rest) give the
    per-op forward's logits and cache, bit for bit, at any thread count."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.llama import Transformer
    from models.runner import ModelRunner, StepInput

    model = all_skinny(ours_from_hf(tiny_hf_model("llama", seed=11)).model)
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                        dtype=torch.bool)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)

    def run():
        runner = ModelRunner(model, cache_tokens=512)
        prompts = {0: [(7 * i) % 90 + 3 for i in range(148)], 1: [(5 * i) % 80 + 5 for i in range(70)], 2: [9] * 20,
                   3: [(3 * i) % 50 + 40 for i in range(130)]}
        for sid, prompt in prompts.items():
            runner.add_sequence(sid)
            runner.step([StepInput(sid, prompt)])
            runner.commit({sid: list(range(len(prompt)))})
        out = runner.step([StepInput(0, [9, 10, 11, 12, 13], [0, 1, 1, 2, 2], tree),
                           StepInput(1, [14, 15, 16]), StepInput(2, [17]), StepInput(3, [18])])
        return torch.cat(out), runner.cache.k.clone(), runner.cache.v.clone()

    calls = []
    real = skinny.layers_unchecked
    monkeypatch.setattr(skinny, "layers_unchecked", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    stacked = run()
    assert 10 in calls  # the decode step went through the one call
    monkeypatch.setattr(Transformer, "_whole_stack", lambda *a: None)
    per_op = run()
    for a, b in zip(stacked, per_op):
        assert torch.equal(a, b)


def test_whole_stack_after_a_cache_of_another_size_at_the_same_address():
    """The layer pointers are cached per cache: a new runner's cache may land at the address of a
    freed one with another number of blocks (another layer stride). Two caches over one storage
    make that happen for sure: the second must give what a fresh model gives (this once wrote and
    read layer i's keys i * the old stride past the pool, in memory of others: wrong tokens on CI)."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.runner import ModelRunner, StepInput

    def build():
        return all_skinny(ours_from_hf(tiny_hf_model("llama", seed=7)).model)

    def run(model, cache_tokens, storage=None):
        runner = ModelRunner(model, cache_tokens=cache_tokens)
        if storage is not None:  # the pools at the start of the two storages
            n = runner.cache.k.numel()
            runner.cache.k = storage[0][:n].view(runner.cache.k.shape)
            runner.cache.v = storage[1][:n].view(runner.cache.v.shape)
        runner.add_sequence(0)
        runner.step([StepInput(0, list(range(3, 30)))])
        runner.commit({0: list(range(27))})
        logits = torch.cat([runner.step([StepInput(0, [31])])[0], runner.step([StepInput(0, [32, 33])])[0]])
        return logits, runner.cache.k.clone(), runner.cache.v.clone()

    storage = torch.zeros(1 << 20), torch.zeros(1 << 20)
    model = build()
    run(model, 512, storage)  # caches the pointers for a 512-token pool at storage's address
    again = run(model, 128, storage)  # same address, a quarter of the layer stride
    for a, b in zip(again, run(build(), 128)):  # logits, and keys and values where they belong
        assert torch.equal(a, b)


@pytest.mark.parametrize("how", ["setattr", "data", "module"])
def test_whole_stack_sees_weights_replaced_after_a_step(how):
    """The whole-stack call keeps its layer walk between steps: a weight replaced afterwards (a
    new Parameter, new ``.data``, a new Linear) must be what the next step uses, as in a model
    built with that weight."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.linear import Linear
    from models.runner import ModelRunner, StepInput

    def build():
        return all_skinny(ours_from_hf(tiny_hf_model("llama", seed=7)).model)

    def logits(model):
        runner = ModelRunner(model, cache_tokens=128)
        runner.add_sequence(0)
        runner.step([StepInput(0, list(range(3, 20)))])
        runner.commit({0: list(range(17))})
        return runner.step([StepInput(0, [21, 22])])[0]

    new_w = torch.randn_like(build().layers[1].w_down.weight) * 0.05
    model = build()
    before = logits(model)
    lin = model.layers[1].w_down
    if how == "setattr":
        lin.weight = torch.nn.Parameter(new_w.clone())
    elif how == "data":
        lin.weight.data = new_w.clone()
    else:
        fresh = Linear(new_w.shape[1], new_w.shape[0], bias=False)
        fresh.weight.data = new_w.clone()
        fresh.plan = lin.plan
        model.layers[1].w_down = fresh
    expected = build()
    expected.layers[1].w_down.weight.data = new_w.clone()
    after = logits(model)
    assert not torch.equal(after, before)
    assert torch.equal(after, logits(expected))


# ---- per-row argmax and top-k of logits (cpu/skinny_reduce.c) -----------------------------------
def _stable_topk(row: torch.Tensor, k: int) -> list[int]:
    """The reference order: largest first, equal values by index."""
    return sorted(range(row.numel()), key=lambda i: (-float(row[i]), i))[:k]


@pytest.mark.parametrize("n", [1, 7, 8, 31, 32, 33, 100, 1000, 4099])
def test_argmax_and_topk_match_torch(n):
    """Random rows (lengths around the 8- and 32-lane blocks): argmax is torch's exactly, top-k
    torch's indices (no ties among random floats)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(5, n, generator=g)
    assert logit_rows.argmax_rows(x) == x.argmax(-1).tolist()
    for k in sorted({1, min(2, n), min(8, n), min(n, logit_rows.MAX_TOPK)}):
        assert logit_rows.topk_rows(x, k) == x.topk(k, dim=-1).indices.tolist(), k
        assert logit_rows.argmax_topk_rows(x, k) == (x.argmax(-1).tolist(), x.topk(k, dim=-1).indices.tolist()), k


@pytest.mark.parametrize("n", [9, 64, 257])
def test_ties_go_to_the_first_index(n):
    """Few distinct values, so every row has many ties, also for its largest value: argmax
    gives the first index of the largest (as torch), top-k equal values in index order."""
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-3, 3, (6, n), generator=g).float()
    x[1] = 2.0  # one value everywhere
    x[2, -1] = 5.0  # the largest last
    x[3] = float("-inf")
    x[4, ::3] = float("-inf")
    x[5] = -0.0
    x[5, n // 2] = 0.0  # -0.0 == 0.0: the first of them
    assert logit_rows.argmax_rows(x) == x.argmax(-1).tolist()
    for k in (1, 3, 8):
        assert logit_rows.topk_rows(x, k) == [_stable_topk(r, k) for r in x], k
        assert logit_rows.argmax_topk_rows(x, k) == (x.argmax(-1).tolist(), [_stable_topk(r, k) for r in x]), k


def test_topk_where_the_kept_values_keep_changing():
    """The kernel skips a 32-value block whose largest does not beat the k-th kept value: rows
    where every block beats it (ascending), none does (descending), ties with it at block
    edges, and a row whose top values all sit in its last block."""
    n = 1000
    rows = [torch.arange(n).float(), torch.arange(n, 0, -1).float(), (torch.arange(n) // 32).float(),
            (torch.arange(n) % 32).float(), torch.zeros(n), torch.randn(n, generator=torch.Generator().manual_seed(5))]
    rows[-1][-31:] += 100.0
    x = torch.stack(rows)
    for k in (1, 4, 8, 33, logit_rows.MAX_TOPK):
        want = [_stable_topk(r, k) for r in x]
        assert logit_rows.topk_rows(x, k) == want, k
        assert logit_rows.argmax_topk_rows(x, k) == (x.argmax(-1).tolist(), want), k


def test_argmax_topk_rows_holding_nan_are_torchs():
    """torch ranks NaN above every number: a row holding one gets torch's answer, the others
    the kernel's."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 300, generator=g)
    x[1, 17] = float("nan")  # in the 32-lane body
    x[2, 299] = float("nan")  # in the tail
    x[3, 0] = float("nan")  # among the first k
    assert logit_rows.argmax_rows(x) == x.argmax(-1).tolist()
    assert logit_rows.topk_rows(x, 5) == x.topk(5, dim=-1).indices.tolist()
    assert logit_rows.argmax_topk_rows(x, 5) == (x.argmax(-1).tolist(), x.topk(5, dim=-1).indices.tolist())


def test_argmax_topk_strided_rows_and_other_inputs():
    """Rows of a wider tensor (row stride > n), a column view, bf16, k past MAX_TOPK and an
    empty batch: the same answers as torch."""
    g = torch.Generator().manual_seed(4)
    wide = torch.randn(3, 200, generator=g)
    x = wide[:, 10:150]
    assert x.stride(0) == 200 and logit_rows.argmax_rows(x) == x.argmax(-1).tolist()
    assert logit_rows.topk_rows(x, 6) == x.topk(6, dim=-1).indices.tolist()
    col = wide.t()[:, :3]  # rows with a stride of 200 between elements: torch runs it
    assert logit_rows.argmax_rows(col) == col.argmax(-1).tolist()
    half = wide.bfloat16()
    assert logit_rows.argmax_rows(half) == half.argmax(-1).tolist()
    k = logit_rows.MAX_TOPK + 1
    assert logit_rows.topk_rows(wide, k) == wide.topk(k, dim=-1).indices.tolist()
    assert logit_rows.argmax_rows(torch.randn(0, 9)) == [] and logit_rows.topk_rows(torch.randn(0, 9), 2) == []
    assert logit_rows.argmax_topk_rows(half, 3) == (half.argmax(-1).tolist(), half.topk(3, dim=-1).indices.tolist())
    assert logit_rows.argmax_topk_rows(torch.randn(0, 9), 2) == ([], [])
    with pytest.raises(ValueError, match="k <= n"):
        logit_rows.argmax_topk_rows(wide, 201)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        logit_rows.topk_rows(wide, 201)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        logit_rows.topk_rows(wide, 0)
    with pytest.raises(ValueError, match=r"x must be \(rows, n\)"):
        logit_rows.argmax_rows(wide[0])


def test_topk_kernel_hands_back_a_k_it_does_not_take():
    """Called with k past its buffer, the C function answers no row (the caller's torch does)."""
    x = torch.randn(2, 100)
    idx = torch.empty(2, 65, dtype=torch.int64)
    bad = torch.empty(2, dtype=torch.int64)
    lib = skinny._lib or skinny._load()
    assert lib.skinny_topk(x.data_ptr(), 2, 100, 100, 65, idx.data_ptr(), bad.data_ptr()) == 2
    assert bad.tolist() == [0, 1]


def test_stack_profile_times_the_phases_of_whole_stack_calls(isa):
    """Inside ``stack_profile`` each phase of the one-call stack is timed (products and attention
    take time, the phases sum to at most the block's wall time); outside it nothing is added."""
    import time

    from helpers import ours_from_hf, tiny_hf_model
    from models.runner import ModelRunner, StepInput

    model = all_skinny(ours_from_hf(tiny_hf_model("llama", seed=7)).model)
    runner = ModelRunner(model, cache_tokens=256)
    runner.add_sequence(0)
    runner.step([StepInput(0, list(range(3, 40)))])
    runner.commit({0: list(range(37))})
    runner.step([StepInput(0, [5, 6])])  # warm
    t = time.perf_counter()
    with skinny.stack_profile() as phases:
        runner.step([StepInput(0, [7, 8, 9])])
    wall = time.perf_counter() - t
    assert set(phases) == set(skinny.STACK_PHASES)
    assert all(v >= 0 for v in phases.values())
    for name in ("qkv", "attention", "gate_up", "down"):
        assert phases[name] > 0, name
    assert sum(phases.values()) <= wall
    import ctypes
    raw = (ctypes.c_double * len(skinny.STACK_PHASES)).in_dll(skinny._lib, "skinny_profile")
    before = list(raw)
    runner.step([StepInput(0, [10])])  # after the block: the profile is off again
    assert list(raw) == before
    with skinny.stack_profile() as idle:  # a new block starts from zero
        pass
    assert all(v == 0 for v in idle.values())


def test_steps_of_up_to_64_rows_stay_on_the_one_call_stack(monkeypatch):
    """A tree step of 17-64 rows (past the 16 the stack once stopped at) is attended by the C
    kernel and runs as the one call, bit for bit the per-op path; so does a longer tree step
    (its rows must not depend on the step's size: kernels/torch_plan.py), while a causal chunk
    of more than 64 rows leaves both (the prefill kernel)."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.linear import STEP_ROWS
    from models.llama import Transformer
    from models.runner import ModelRunner, StepInput

    model = all_skinny(ours_from_hf(tiny_hf_model("llama", seed=7)).model)

    def run(t, tree=True):
        runner = ModelRunner(model, cache_tokens=512)
        runner.add_sequence(0)
        runner.step([StepInput(0, list(range(3, 40)))])
        runner.commit({0: list(range(37))})
        parents = [-1] + [(i - 1) // 2 for i in range(1, t)] if tree else None  # a binary tree of t nodes
        return runner.step([StepInput(0, [(5 + i) % 200 for i in range(t)], parents=parents)])[0]

    stack, attention, use_stack = [], [], [True]
    real_stack, real_attention = skinny.layers_unchecked, skinny.attention_unchecked
    real_whole = Transformer._whole_stack
    monkeypatch.setattr(skinny, "layers_unchecked", lambda *a: stack.append(a[0].shape[0]) or real_stack(*a))
    monkeypatch.setattr(skinny, "attention_unchecked",
                        lambda *a, **k: attention.append(a[0].shape[0]) or real_attention(*a, **k))
    monkeypatch.setattr(Transformer, "_whole_stack", lambda *a: real_whole(*a) if use_stack[0] else None)
    for t in (40, STEP_ROWS):
        stacked = run(t)
        assert t in stack
        use_stack[0] = False
        attention.clear()
        per_op = run(t)
        use_stack[0] = True
        assert t in attention  # the per-op path's attention is the C kernel too
        assert torch.equal(stacked, per_op)
    stack.clear()
    attention.clear()
    run(STEP_ROWS + 1)
    assert STEP_ROWS + 1 in stack
    stack.clear()
    attention.clear()
    run(STEP_ROWS + 1, tree=False)
    assert STEP_ROWS + 1 not in stack and STEP_ROWS + 1 not in attention


# ---- the LM head's greedy top-k, screened in bf16 (skinny.head_topk) -----------------------------
needs_screen = pytest.mark.skipif(not skinny.head_available(),
                                  reason="the LM head screen needs a CPU and build with AVX512-BF16")


@needs_screen
@pytest.mark.parametrize("n,kd", [(1, 32), (37, 13), (1000, 100), (4099, 64), (3001, 576)])
def test_head_topk_is_the_topk_of_the_multiplied_out_logits(n, kd):
    """Exactly the reference's ids (the top-k of skinny_linear's logits, equal values in index
    order), rows of W not a multiple of the tile, K not a multiple of 32, M from 1 to past the
    tiles, k from 1 to 64."""
    g = torch.Generator().manual_seed(n + kd)
    w = torch.randn(n, kd, generator=g) * 0.1
    screen = skinny.HeadScreen(w)
    for m in (1, 2, 3, 5, 8, 13, 33):
        h = torch.randn(m, kd, generator=g) * 3
        for k in sorted({1, min(2, n), min(8, n), min(64, n)}):
            count: list = []
            idx, bad = skinny.head_topk(h, screen, k, candidates=count)
            assert bad == [] and idx.shape == (m, k)
            assert idx.tolist() == skinny.head_topk_ref(h, w, k), (m, k)
            assert all(k <= c <= n for c in count)


@needs_screen
def test_head_topk_near_ties_and_exact_ties():
    """Logits closer together than bf16 can tell apart: the screen keeps every one it cannot
    rule out and the exact pass orders them (an exact tie goes to the first index). Rows of W
    nearly alike make most of the vocabulary such candidates."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(1, 256, generator=g)
    w = base + 1e-4 * torch.randn(2048, 256, generator=g)
    w[1500] = base[0] * 1.001  # the largest logits of the rows along base
    w[100] = w[1500]  # an exact tie
    w[7] = w[1500] * (1 + 2 ** -22)  # within a rounding or two of it
    screen = skinny.HeadScreen(w)
    h = torch.cat([base, base, torch.randn(3, 256, generator=g)])
    for k in (1, 3, 16):
        count: list = []
        idx, bad = skinny.head_topk(h, screen, k, candidates=count)
        assert bad == [] and idx.tolist() == skinny.head_topk_ref(h, w, k)
        assert count[0] > 100  # the screen could not rule most of them out: all computed exactly
    top3 = skinny.head_topk(h[1:2], screen, 3)[0][0].tolist()
    assert sorted(top3) == [7, 100, 1500] and top3.index(100) < top3.index(1500)  # the tie in index order


@needs_screen
def test_head_topk_a_row_does_not_depend_on_its_step():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(777, 64, generator=g)
    screen = skinny.HeadScreen(w)
    h = torch.randn(20, 64, generator=g)
    alone = torch.cat([skinny.head_topk(h[r:r + 1], screen, 4)[0] for r in range(20)])
    for threads in (1, 2, 3):
        assert torch.equal(skinny.head_topk(h, screen, 4, threads=threads)[0], alone)


@needs_screen
def test_head_topk_rows_it_cannot_screen_and_bad_input():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(300, 48, generator=g)
    screen = skinny.HeadScreen(w)
    h = torch.randn(4, 48, generator=g)
    h[1, 3], h[2, 0] = float("nan"), float("inf")
    idx, bad = skinny.head_topk(h, screen, 2)
    assert bad == [1, 2]
    assert idx[[0, 3]].tolist() == skinny.head_topk_ref(h[[0, 3]], w, 2)
    for k in (0, 65, 1.0):
        with pytest.raises(ValueError, match="k must be in"):
            skinny.head_topk(h, screen, k)
    with pytest.raises(ValueError, match=r"h must be \(M, 48\)"):
        skinny.head_topk(torch.randn(2, 47), screen, 1)
    with pytest.raises(ValueError, match="h must be a contiguous float32"):
        skinny.head_topk(h.double(), screen, 1)
    w.add_(1.0)  # written in place: the bf16 copy no longer holds
    with pytest.raises(ValueError, match="stale"):
        skinny.head_topk(h, screen, 1)
    with pytest.raises(ValueError, match="weight must be finite"):
        skinny.HeadScreen(torch.full((4, 8), float("inf")))


def test_whole_stack_gathers_the_embedding_and_refuses_a_token_outside_the_vocabulary(monkeypatch):
    """The one-call stack takes the step's token ids and gathers their embedding rows itself: a
    token id outside the vocabulary raises IndexError there as the embedding would, before any
    layer ran (the cache unchanged)."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.runner import ModelRunner, StepInput

    model = all_skinny(ours_from_hf(tiny_hf_model("llama", seed=7)).model)
    runner = ModelRunner(model, cache_tokens=64)
    runner.add_sequence(0)
    runner.step([StepInput(0, list(range(3, 20)))])
    runner.commit({0: list(range(17))})
    tokens, meta, idx = runner.prepare([StepInput(0, [21, 22])])
    calls = []
    real = skinny.layers_unchecked
    monkeypatch.setattr(skinny, "layers_unchecked", lambda *a: calls.append(a[3].tokens) or real(*a))
    k_before = runner.cache.k.clone()
    for wrong in (model.cfg.vocab_size, -1):
        bad = tokens.clone()
        bad[1] = wrong
        with pytest.raises(IndexError):
            model(bad, meta, runner.cache.k, runner.cache.v, idx)
        assert calls and calls[-1] is not None and torch.equal(runner.cache.k, k_before)
