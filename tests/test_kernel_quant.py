"""The quantized CPU product (kernels/quant.py, cpu/quant_gemm.c) against its reference.

Tolerance, stated once: the integer dot products are exact and the reference computes the same
quantized activations times the same weight values exactly (float64), so the kernel differs only
by its fp32 scaling and summing, a few roundings per block: |y - ref| <= 1e-5 times the sum of
the terms' magnitudes (|x_q| @ (|d| u + |m|).T) plus 1e-6."""

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch

from kernels import quant, skinny

pytestmark = pytest.mark.skipif(not skinny.available(), reason=f"skinny kernels: {skinny.unavailable_reason()}")
GGUF_TYPES = {"q4_1": gguf.GGMLQuantizationType.Q4_1, "q8_0": gguf.GGMLQuantizationType.Q8_0,
              "q4_k": gguf.GGMLQuantizationType.Q4_K}
FMTS = ["q4_1", "q8_0", "q4_k"]  # the GGUF formats the kernel reads (q4_k packed as q4_1f)


@pytest.fixture(params=list(skinny.ISAS))
def isa(request):
    """Each build in turn, as tests/test_kernel_skinny.py does."""
    if request.param not in skinny.cpu_isas():
        pytest.skip(f"this CPU does not run {request.param}")
    before = skinny.use_isa(request.param)
    yield request.param
    skinny.use_isa(before)


def kdim(fmt: str, k: int) -> int:
    """A test's K for ``fmt``: Q4_K's super-blocks hold 256 weights (rounded to a multiple of 256)."""
    return max(1, round(k / 256)) * 256 if fmt == "q4_k" else k


def q4_k_bytes(n: int, k: int, seed: int) -> np.ndarray:
    """Random Q4_K super-blocks (gguf has no Q4_K quantizer): random scale and nibble bytes, D and
    Dmin random finite fp16 of the size a weight's scale has."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    for off in (0, 2):
        h = np.abs(rng.standard_normal((n, k // 256)) * 0.02).astype(np.float16)
        raw[:, :, off:off + 2] = h.view(np.uint8).reshape(n, k // 256, 2)
    return raw.reshape(-1)


def weight(fmt: str, n: int, k: int, seed: int) -> tuple[quant.QuantWeight, torch.Tensor]:
    """A random weight quantized by gguf's own quantizer (Q4_K: random blocks) and packed from
    its block bytes, and the file's dequantized fp32 weight."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).numpy()
    raw = q4_k_bytes(n, k, seed) if fmt == "q4_k" else gq.quantize(w, GGUF_TYPES[fmt])
    ref = gq.dequantize(raw, GGUF_TYPES[fmt]).astype(np.float32).reshape(n, k)
    return quant.pack_gguf(raw, fmt, (n, k)), torch.from_numpy(ref)


def assert_close_to_ref(y, x, qw, bias=None):
    ref = quant.quant_linear_ref(x, qw, bias)
    q, s = quant.quantize_rows_ref(x)
    m, k = x.shape
    xq = (q.double().view(m, k // 32, 32) * s.double()[:, :, None]).view(m, k).abs()
    u, d, off = qw.parts()
    n = qw.n
    mag = (u.double() - (128 if qw.format == "q8_0" else 0)).abs().view(n, k // 32, 32) * d.double().abs()[:, :, None]
    if off is not None:
        mag = mag + off.double().abs()[:, :, None]
    bound = 1e-5 * (xq @ mag.view(n, k).T) + 1e-6
    assert y.shape == ref.shape and y.dtype == torch.float32
    err = (y.double() - ref.double()).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item()}, bound there {bound.flatten()[err.argmax()]}"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", [(1, 32), (17, 96), (37, 64), (131, 576), (48, 1504)])
def test_packing_keeps_the_files_weights(fmt, n, k):
    """Packed from GGUF's block bytes, the weight is the file's dequantized one, bit for bit
    (rows not a multiple of the 16-row panel, an odd number of blocks; Q4_K's fp32 scales)."""
    k = kdim(fmt, k)
    qw, ref = weight(fmt, n, k, n + k)
    assert qw.shape == (n, k) and qw.format == ("q4_1f" if fmt == "q4_k" else fmt)
    assert torch.equal(qw.dequantize().view(torch.int32), ref.view(torch.int32))
    # the file's bytes a block (Q4_K: 18 a 32-weight block in the file, 24 with fp32 scales here)
    assert qw.nbytes == -(-n // 16) * 16 * k // 32 * {"q4_1": 20, "q8_0": 34, "q4_k": 24}[fmt]


def test_fp32_weights_quantize_to_q8_0_as_llama_cpp_does():
    """quantize_q8_0 gives gguf's own Q8_0 values (llama.cpp's rule); q4_1 from fp32 stays
    within half a step of the weight."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(33, 160, generator=g)
    ours = quant.quantize_q8_0(w).dequantize()
    theirs = torch.from_numpy(gq.dequantize(gq.quantize(w.numpy(), GGUF_TYPES["q8_0"]), GGUF_TYPES["q8_0"]))
    torch.testing.assert_close(ours, theirs.float(), atol=0, rtol=0)
    q4 = quant.quantize_q4_1(w)
    step = (w.view(33, 5, 32).amax(2) - w.view(33, 5, 32).amin(2)) / 15
    assert bool(((q4.dequantize() - w).view(33, 5, 32).abs() <= step[:, :, None] * 0.51 + 1e-3).all())


def test_activations_quantize_as_the_reference():
    """The kernel's quantization of x is its reference's, bit for bit (ties to even, zero blocks)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 96, generator=g)
    x[1, 32:64] = 0  # an all-zero block
    x[2, :32] = torch.arange(32) - 16.0  # many exact ties after scaling by 127 / 16
    q, s = quant.quantize_rows(x)
    q_ref, s_ref = quant.quantize_rows_ref(x)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (37, 64), (131, 576), (50, 1504)])
def test_matches_reference(fmt, n, k, bias, isa):
    """Random shapes: N not a multiple of the panel, K an odd number of blocks, M from 0 to beyond
    the tiles, with and without bias, on each build."""
    k = kdim(fmt, k)
    qw, _ = weight(fmt, n, k, 3 * n + k)
    g = torch.Generator().manual_seed(n * 1000 + k)
    b = torch.randn(n, generator=g) if bias else None
    for m in (0, 1, 2, 3, 4, 5, 7, 8, 13, 33):
        x = torch.randn(m, k, generator=g) * 3
        y = quant.quant_linear(x, qw, b)
        assert y.shape == (m, n) and y.is_contiguous()
        if m:
            assert_close_to_ref(y, x, qw, b)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_row_does_not_depend_on_its_step(fmt, threads, isa):
    """Bit for bit: a row's result alone, inside any number of rows (1 .. 64), at any place, and
    with any thread count is the same; N odd, K an odd multiple of 32 (Q4_K: 256)."""
    k = kdim(fmt, 160)
    qw, _ = weight(fmt, 67, k, 11)
    g = torch.Generator().manual_seed(7)
    b = torch.randn(67, generator=g)
    x = torch.randn(64, k, generator=g)
    alone = torch.cat([quant.quant_linear(x[i:i + 1], qw, b, threads=1) for i in range(64)])
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 16, 33, 64):
        for start in (0, 64 - m, (64 - m) // 2):
            got = quant.quant_linear(x[start:start + m], qw, b, threads=threads)
            assert torch.equal(got, alone[start:start + m]), (m, start)


def tied(fmt: str, n: int, k: int, seed: int) -> quant.QuantWeight:
    """A weight whose n rows repeat 5 distinct ones (their logits tie exactly, across the threads'
    ranges of columns too): Q8_0 and Q4_1 quantized here, Q4_K from random blocks."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, 5, (n,), generator=g)
    if fmt == "q4_k":
        raw = q4_k_bytes(5, k, seed).reshape(5, -1)[pick.numpy()]
        return quant.pack_gguf(raw.reshape(-1), fmt, (n, k))
    w = torch.randn(5, k, generator=g)[pick]
    return quant.quantize_q8_0(w) if fmt == "q8_0" else quant.quantize_q4_1(w)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_head_ranks_its_logits_as_the_rows_kernels_do(fmt, threads, isa):
    """quant_linear_topk: the product's logits bit for bit, and every row's argmax and top-k
    those of ``kernels.rows`` over them (equal values in index order: weights with tied rows,
    ties across the threads' column ranges; k up to N and 64; N not a multiple of the panel);
    a row holding a NaN gets torch's answers, the other rows theirs."""
    from kernels import rows
    k = kdim(fmt, 96)
    for n, seed in ((67, 1), (5, 2), (300, 3)):
        qw = tied(fmt, n, k, seed) if seed != 3 else weight(fmt, n, k, seed)[0]
        g = torch.Generator().manual_seed(seed)
        for m in (1, 2, 3, 5, 9):
            x = torch.randn(m, k, generator=g)
            if m == 5:
                x[3, 7] = float("inf")  # its block's scale is inf: every logit of the row NaN
            y = quant.quant_linear(x, qw, threads=threads)
            assert m != 5 or bool(y[3].isnan().all())
            for kk in sorted({1, 2, 5, min(n, 64)}):
                if kk > n:
                    continue
                got_y, top1, topk = quant.quant_linear_topk(x, qw, kk, threads=threads)
                assert torch.equal(got_y.view(torch.int32), y.view(torch.int32))  # NaN rows too
                if kk == 1:
                    assert top1 == rows.argmax_rows(y), (n, m)
                else:
                    assert (top1, topk) == rows.argmax_topk_rows(y, kk), (n, m, kk)
    # more threads than the merge takes lists (256): the product runs on 256, the same answers
    wide = tied(fmt, 20000, k, 4)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(9))
    y = quant.quant_linear(x, wide, threads=threads)
    got = quant.quant_linear_topk(x, wide, 3, threads=300)
    assert torch.equal(got[0], y) and got[1:] == rows.argmax_topk_rows(y, 3)
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 5\], got 6"):
        quant.quant_linear_topk(torch.randn(1, k), tied(fmt, 5, k, 2), 6)
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 64\], got True"):
        quant.quant_linear_topk(torch.randn(1, k), qw, True)
    with pytest.raises(ValueError, match=r"x must be a float32 CPU \(M, \d+\) tensor"):
        quant.quant_linear_topk(torch.randn(1, k + 32), qw, 1)


def test_strided_rows_are_read_in_place():
    """x's rows may be strided (a slice of wider rows): the same result as the contiguous copy."""
    qw, _ = weight("q4_1", 20, 64, 1)
    wide = torch.randn(6, 100)
    x = wide[:, 10:74]
    assert not x.is_contiguous()
    assert torch.equal(quant.quant_linear(x, qw), quant.quant_linear(x.contiguous(), qw))


def test_bad_arguments_are_named():
    qw, _ = weight("q8_0", 8, 64, 0)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match=r"x must be \(M, 64\)"):
        quant.quant_linear(torch.randn(2, 32), qw)
    with pytest.raises(ValueError, match="x must be a float32 CPU tensor with contiguous rows"):
        quant.quant_linear(x.double(), qw)
    with pytest.raises(ValueError, match="x must be a float32 CPU tensor with contiguous rows"):
        quant.quant_linear(torch.randn(64, 2).t(), qw)
    with pytest.raises(ValueError, match=r"bias must be a contiguous float32 CPU tensor of shape \(8,\)"):
        quant.quant_linear(x, qw, torch.randn(7))
    with pytest.raises(ValueError, match="threads must be None or an int >= 1"):
        quant.quant_linear(x, qw, threads=0)
    with pytest.raises(ValueError, match="weight must be a QuantWeight"):
        quant.quant_linear(x, torch.randn(8, 64))
    with pytest.raises(ValueError, match="weight must be a QuantWeight of format q4_1 or q8_0 or q4_1f, got 'q5_0'"):
        quant.quant_linear(x, quant.QuantWeight("q5_0", qw.data, 8))
    with pytest.raises(ValueError, match="weight.data must be a contiguous uint8 CPU tensor"):
        quant.quant_linear(x, quant.QuantWeight("q4_1", qw.data, 8))  # q8_0 bytes named q4_1
    with pytest.raises(ValueError, match="weight.data must be .* with n=17"):
        quant.quant_linear(x, quant.QuantWeight("q8_0", qw.data, 17))  # more rows than its panels
    with pytest.raises(ValueError, match="fmt must be one of q4_1, q8_0 or q4_k"):
        quant.pack_gguf(np.zeros(68, np.uint8), "q4_0", (1, 64))
    with pytest.raises(ValueError, match="raw must hold 68 uint8 bytes"):
        quant.pack_gguf(np.zeros(67, np.uint8), "q8_0", (1, 64))
    with pytest.raises(ValueError, match="shape must be .* K a multiple of 32"):
        quant.pack_gguf(np.zeros(68, np.uint8), "q8_0", (1, 60))
    with pytest.raises(ValueError, match="weight must be .* K a multiple of 32"):
        quant.quantize_q8_0(torch.randn(3, 40))
    with pytest.raises(ValueError, match=r"shape must be \(N, K\) with N >= 1 and K a multiple of 256, got \(1, 288\)"):
        quant.pack_gguf(np.zeros(162, np.uint8), "q4_k", (1, 288))
    with pytest.raises(ValueError, match="raw must hold 288 uint8 bytes \\(1 x 2 blocks of 144\\), got .* with 144"):
        quant.pack_q4_k(np.zeros(144, np.uint8), (1, 512))


def test_the_builds_agree_with_the_reference_and_vnni_where_the_cpu_has_it():
    """Where the CPU has AVX512-VNNI the AVX-512 build uses it; every build's result is within
    the tolerance of the same reference."""
    qw, _ = weight("q8_0", 40, 96, 9)
    x = torch.randn(5, 96)
    before = skinny.isa()
    try:
        for name in skinny.cpu_isas():
            skinny.use_isa(name)
            assert quant.vnni() == (name == "avx512" and "avx512_vnni" in skinny.cpu_flags())
            assert_close_to_ref(quant.quant_linear(x, qw), x, qw)
    finally:
        skinny.use_isa(before)


def test_the_avx512_build_without_vnni(monkeypatch):
    """A CPU with AVX-512 but no VNNI (Skylake-X) gets maddubs + madd: built here by hiding the
    flag, checked against the same reference and for row independence."""
    if "avx512" not in skinny.cpu_isas() or "avx512_vnni" not in skinny.cpu_flags():
        pytest.skip("needs an AVX-512 CPU with VNNI to build the variant without it")
    flags = skinny.cpu_flags() - {"avx512_vnni"}
    before = skinny.isa()
    monkeypatch.setattr(skinny, "cpu_flags", lambda: flags)
    monkeypatch.setattr(skinny, "_built", {})
    try:
        skinny.use_isa("avx512")
        assert not quant.vnni()
        for fmt in FMTS:
            qw, _ = weight(fmt, 37, kdim(fmt, 96), 4)
            x = torch.randn(9, kdim(fmt, 96)) * 2
            y = quant.quant_linear(x, qw)
            assert_close_to_ref(y, x, qw)
            assert torch.equal(torch.cat([quant.quant_linear(x[i:i + 1], qw) for i in range(9)]), y)
    finally:
        monkeypatch.undo()
        skinny.use_isa(before)
