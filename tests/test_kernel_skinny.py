"""The hand-written CPU product for few rows (kernels/skinny.py) against its reference."""

import pytest
import torch

from kernels import skinny

pytestmark = pytest.mark.skipif(not skinny.available(), reason=f"skinny kernel: {skinny.unavailable_reason()}")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", [(1, 8), (7, 13), (37, 29), (96, 64), (131, 576)])
def test_matches_reference(n, k, bias):
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
def test_a_row_does_not_depend_on_its_step(threads):
    """Bit for bit: a row's result alone, inside any number of rows, at any place, and with any
    thread count is the same (a BLAS switches kernels with M and differs by rounding)."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(50, 99, generator=g), torch.randn(50, generator=g)
    x = torch.randn(17, 99, generator=g)
    alone = torch.cat([skinny.skinny_linear(x[i:i + 1], w, b, threads=1) for i in range(17)])
    for m in range(1, 18):
        for start in (0, 17 - m):
            assert torch.equal(skinny.skinny_linear(x[start:start + m], w, b, threads=threads), alone[start:start + m])


def test_bad_input_is_named():
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="same K"):
        skinny.skinny_linear(torch.randn(2, 15), w)
    with pytest.raises(ValueError, match="x must be a contiguous float32"):
        skinny.skinny_linear(torch.randn(2, 16, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="weight must be .*not contiguous"):
        skinny.skinny_linear(torch.randn(2, 16), torch.randn(16, 8).t())
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
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")  # "compiles" nothing
    assert not skinny.available()
    assert "could not build" in skinny.unavailable_reason()
    with pytest.raises(RuntimeError, match="unavailable"):
        skinny.skinny_linear(torch.randn(1, 8), torch.randn(4, 8))
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind
