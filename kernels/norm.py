"""RMSNorm, optionally after a residual add, in one launch: ``rms_norm`` (Triton) beside
``rms_norm_ref`` (torch).

The torch form of a 16-bit RMSNorm is eight small ops (cast, square, mean, add, rsqrt,
multiply, cast, multiply), and a decoder layer has two of them plus the residual add before
the second: on a GPU at small step sizes each is a launch that costs more host time than its
work (docs/DESIGN.md, "The GPU path"). One program per row does the same arithmetic:

    h   = x + residual                    (in x's dtype: fp32 sum, rounded, as torch adds)
    out = weight * (h32 * rsqrt(mean(h32^2) + eps)).to(dtype)     with h32 = h in fp32

which is Hugging Face's ``LlamaRMSNorm`` (normalise in fp32, round to the input's dtype, then
scale by the weight in the weight's dtype; the model keeps both in one dtype). Only the sum
over the row is ordered differently from torch's, so fp32 results agree to a few ulps and
16-bit ones to one rounding step. Rows may be strided (``stride(-1) == 1``).
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from kernels.elementwise import check_rows

MAX_COLS = 65536  # one row in one program


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: Optional[torch.Tensor] = None):
    """x (rows, n) [+ residual] -> normed (rows, n), or (x + residual, normed) with a residual."""
    h = x if residual is None else x + residual
    hf = h.float()
    out = weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return out if residual is None else (h, out)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, h_ptr,
    n_cols, eps,
    stride_x, stride_r, stride_o, stride_h,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(h_ptr + row * stride_h + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    y = (xf * tl.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype), mask=ok)


def _check(x, weight, residual) -> None:
    check_rows("x", x)
    n = x.shape[1]
    if not 1 <= n <= MAX_COLS:
        raise ValueError(f"rows must have 1 .. {MAX_COLS} elements, got {n}")
    if not isinstance(weight, torch.Tensor) or weight.shape != (n,) or weight.dtype != x.dtype \
            or weight.device != x.device or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous ({n},) {x.dtype} tensor on {x.device}, got "
                         f"{getattr(weight, 'shape', weight)} {getattr(weight, 'dtype', '')}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x.shape
                                 or residual.dtype != x.dtype or residual.device != x.device
                                 or residual.stride(-1) != 1):
        raise ValueError(f"residual must match x ({tuple(x.shape)}, {x.dtype}, {x.device}, stride(-1) == 1), "
                         f"got {getattr(residual, 'shape', residual)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None):
    """Triton version of ``rms_norm_ref`` (same arguments, same result up to the order of one
    sum). Grid: one program per row."""
    _check(x, weight, residual)
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    h = torch.empty_like(out) if residual is not None else out
    if rows:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out, h,
            n, float(eps),
            x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), h.stride(0),
            HAS_RES=residual is not None, BLOCK=block,
            num_warps=4 if block <= 2048 else 8,
        )
    return out if residual is None else (h, out)
