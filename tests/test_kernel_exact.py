"""The exact path's kernels: ``exact_linear`` against its reference and a row's product bit for
bit the same in steps of 1, 7, 64 and 256 rows.

Under the CPU interpreter the dots are numpy's: these checks are necessary there, not
sufficient; on a GPU (tests/conftest.py runs this file natively) they check the compiled kernels.
"""

import pytest
import torch

from kernels.exact_linear import TILE, exact_linear, exact_linear_ref

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
