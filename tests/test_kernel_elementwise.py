"""rope / silu_mul (Triton) against rope_ref / silu_mul_ref: odd shapes, strided rows, three
dtypes, bad inputs; bit for bit on a GPU, within the interpreter's bf16 truncation on a CPU."""

import pytest
import torch

from kernels.backend import triton_interpreted
from kernels.elementwise import rope, rope_ref, silu_mul, silu_mul_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def same(got, want, dtype, silu=False, scale=1.0):
    """Bit for bit, except where the CPU interpreter truncates to bf16 (a step of each rounded
    product and sum: absolute, at the inputs' ``scale``, since a sum may cancel) and, for silu,
    one rounding step of its exponential."""
    if dtype == torch.bfloat16 and triton_interpreted():
        torch.testing.assert_close(got, want, rtol=2 ** -6, atol=3 * 2 ** -7 * scale)
    elif silu:
        rtol = {torch.float32: 1e-6, torch.float16: 2 ** -9, torch.bfloat16: 2 ** -6}[dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-6)
    else:
        assert torch.equal(got, want)


def tables(T, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(T, D // 2, generator=g) * 100
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], -1).to(dtype), torch.cat([-sin, sin], -1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, heads, D, extra", [(1, 3, 64, 2), (5, 6, 32, 0), (7, 2, 10, 1), (3, 4, 128, 2)])
def test_rope_matches_ref(dtype, T, heads, D, extra):
    qkv = rand((T, (heads + extra) * D), dtype, T * D)
    cos, sin = tables(T, D, dtype, heads)
    got, want = qkv.clone(), qkv.clone()
    rope(got, cos, sin, heads, D)
    rope_ref(want, cos, sin, heads, D)
    same(got, want, dtype, scale=float(qkv.abs().max()))
    assert torch.equal(got[:, heads * D:], qkv[:, heads * D:])  # the v heads (and beyond) untouched


def test_rope_on_strided_rows():
    big = rand((4, 500), torch.float32, 1)
    qkv = big[:, :192]  # rows 500 apart
    cos, sin = tables(4, 64, torch.float32, 2)
    want = qkv.clone()
    rope(qkv, cos, sin, 2, 64)
    rope_ref(want, cos, sin, 2, 64)
    assert torch.equal(qkv, want) and torch.equal(big[:, 192:], rand((4, 500), torch.float32, 1)[:, 192:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, n", [(1, 96), (5, 33), (3, 1500)])
def test_silu_mul_matches_ref(dtype, T, n):
    gu = rand((T, 2 * n), dtype, n, scale=3.0)
    same(silu_mul(gu), silu_mul_ref(gu), dtype, silu=True)
    strided = rand((T, 2 * n + 7), dtype, n + 1)[:, :2 * n]
    same(silu_mul(strided), silu_mul_ref(strided), dtype, silu=True)


@pytest.mark.parametrize("call, match", [
    (lambda: rope(torch.zeros(2, 8), *tables(2, 4, torch.float32, 0), 3, 4), "fit"),
    (lambda: rope(torch.zeros(2, 8), *tables(2, 4, torch.float32, 0), 1, 3), "even"),
    (lambda: rope(torch.zeros(2, 8), *tables(3, 4, torch.float32, 0), 1, 4), "cos"),
    (lambda: rope(torch.zeros(2, 8), *tables(2, 4, torch.float16, 0), 1, 4), "cos"),
    (lambda: rope(torch.zeros(8), *tables(2, 4, torch.float32, 0), 1, 4), "2-D"),
    (lambda: silu_mul(torch.zeros(2, 7)), "even"),
    (lambda: silu_mul(torch.zeros(2, 8, dtype=torch.int32)), "float32"),
])
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_fused_ops_are_on_for_compiled_triton_unless_switched_off(monkeypatch):
    import kernels.backend as kb

    monkeypatch.setattr(kb, "triton_interpreted", lambda: False)  # as on a GPU
    monkeypatch.delenv("SPECDEC_FUSED", raising=False)
    assert kb.TritonBackend().fused_ops
    monkeypatch.setenv("SPECDEC_FUSED", "0")
    assert not kb.TritonBackend().fused_ops
    monkeypatch.setattr(kb, "triton_interpreted", lambda: True)  # the CPU interpreter: torch ops
    monkeypatch.delenv("SPECDEC_FUSED")
    assert not kb.TritonBackend().fused_ops and not kb.TorchBackend().fused_ops
