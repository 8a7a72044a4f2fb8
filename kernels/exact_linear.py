"""Matrix products whose every output element is computed the same way whatever the number of
rows: ``exact_linear`` (Triton) beside ``exact_linear_ref`` (torch).

cuBLAS (and any BLAS) picks its kernel by shape, so a row of ``x @ W.T`` in a 64-row tree
verification step is reduced in another order than the same row in a one-row decoding step, and
a bf16 greedy token can flip between them (docs/DESIGN.md, "Verification"). Here one tile shape
and one K order serve every row count:

    out[m, n] = round( (((0 + x[m, 0:BK] . w[n, 0:BK]) + x[m, BK:2BK] . w[n, BK:2BK]) + ...) + b[n] )

with each BK-wide partial dot product formed by ``tl.dot`` (tensor cores on a GPU, fp32
accumulation) and added into one fp32 accumulator in K order; the bias is added to that
accumulator in fp32 and the sum rounded once to the output dtype. There is no split-K and the
tile (``TILE``) does not depend on M, so row m's arithmetic is the same in a step of 1, 7, 64 or
256 rows and at any place in its tile: a row's result does not depend on the step it is in, bit
for bit. On a GPU that also assumes that a tensor-core instruction's result for one element
does not depend on the element's place in the tile; tests/test_kernel_exact.py checks it
natively there (under the CPU interpreter the dot is numpy's, so the check is necessary, not
sufficient).

``TILE`` is chosen for decoding steps: BLOCK_M = 16 (the smallest tensor-core tile: a one-row
step computes 15 padded rows, which cost no extra weight reads), BLOCK_N = 64 (more programs
for the small N of a small model's projections), BLOCK_K = 128 for 16-bit inputs, 64 for fp32
(the same bytes per load). Weights are in ``nn.Linear``'s layout (N, K), read as they are.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from kernels.elementwise import check_rows, silu_mul_ref
from kernels.norm import rms_norm_ref

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (BLOCK_M, BLOCK_N, BLOCK_K) by input dtype: one tile for every row count
TILE = {torch.bfloat16: (16, 64, 128), torch.float16: (16, 64, 128), torch.float32: (16, 64, 64)}


def exact_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     out_dtype: Optional[torch.dtype] = None, *, norm: Optional[torch.Tensor] = None,
                     eps: float = 1e-6, silu: bool = False, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T + bias (N,) -> (M, N) in ``out_dtype`` (default x's), formed
    in fp32 and rounded once. The fused steps, each as its own reference computes it: ``norm``
    (K,) RMS-normalises x's rows first (``rms_norm_ref``, ``eps``); ``silu``: x is (M, 2K), gate
    and up side by side, and the product takes ``silu_mul_ref`` of it; ``residual`` (M, N) is
    added to the rounded product (torch's add: in fp32, rounded)."""
    if silu:
        x = silu_mul_ref(x)
    if norm is not None:
        x = rms_norm_ref(x, norm, eps)
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    y = y.to(out_dtype or x.dtype)
    return y if residual is None else residual + y


# M is not specialised: Triton would otherwise compile (and may generate) another variant for
# M == 1 and for M divisible by 16; one variant serves every step width
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    x_ptr,  # (M, K), rows strided, stride(-1) == 1; with SILU (M, 2K): gate, then up
    w_ptr,  # (N, K), stride(-1) == 1: nn.Linear's weight
    b_ptr,  # (N,); read only when HAS_BIAS
    out_ptr,  # (M, N), stride(-1) == 1
    nw_ptr,  # (K,) the RMSNorm's weight; read only when NORM
    res_ptr,  # (M, N), stride(-1) == 1, the residual; read only when RESIDUAL
    M, N, K,
    stride_xm, stride_wn, stride_om, stride_rm,
    eps,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # x's rows RMS-normed first (kernels/norm.py's arithmetic)
    SILU: tl.constexpr,  # x = silu(gate) * up (kernels/elementwise.py's arithmetic)
    RESIDUAL: tl.constexpr,  # out = residual + the product, rounded as torch adds
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST_DOT: tl.constexpr,  # the CPU interpreter: dot in fp32 (its 16-bit dots are wrong)
    DOT_PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    if NORM:  # each row's sum of squares, K in order, BLOCK_K at a time: the same for every M
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            xs = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :],
                         other=0.0).to(tl.float32)
            ss += tl.sum(xs * xs, axis=1)
        inv = tl.rsqrt(ss / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K in order, one accumulator: the same sequence of additions for every row and step width.
    # Past K the loads give 0, whose products add exact zeros.
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        x_at = x_ptr + rm[:, None] * stride_xm + kk[None, :]
        x = tl.load(x_at, mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        if SILU:  # rounded where silu_mul rounds: silu(gate), then its product with up
            u = tl.load(x_at + K, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            g = x.to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(x.dtype)
            x = (s.to(tl.float32) * u.to(tl.float32)).to(x.dtype)
        if NORM:  # rounded where rms_norm rounds: the normed row, then its product with the weight
            nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0)
            y = (x.to(tl.float32) * inv[:, None]).to(x.dtype)
            x = (nw.to(tl.float32)[None, :] * y.to(tl.float32)).to(x.dtype)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0)  # (BLOCK_K, BLOCK_N): W's rows as columns
        if UPCAST_DOT:
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(out_ptr.dtype.element_ty)
    if RESIDUAL:  # the product rounded first, then added in fp32 and rounded: torch's residual + y
        r = tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], y, mask=m_ok[:, None] & n_ok[None, :])


def _check(x, weight, bias, out_dtype, norm, silu, residual) -> None:
    check_rows("x", x)
    K = x.shape[1] // 2 if silu else x.shape[1]
    if silu and x.shape[1] % 2:
        raise ValueError(f"with silu, x must be (M, 2K): gate and up side by side, got {x.shape[1]} columns")
    if norm is not None and silu:
        raise ValueError("norm and silu cannot both be given: the norm takes x's rows, silu a gate and up")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"weight must be a 2-D (N, {K}) tensor (nn.Linear's layout), got "
                         f"{getattr(weight, 'shape', weight)}")
    if weight.dtype != x.dtype or weight.device != x.device or weight.stride(-1) != 1:
        raise ValueError(f"weight must be {x.dtype} on {x.device} with stride(-1) == 1, got {weight.dtype} on "
                         f"{weight.device}, strides {weight.stride()}")
    N = weight.shape[0]
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (N,) or bias.dtype != x.dtype
                             or bias.device != x.device or not bias.is_contiguous()):
        raise ValueError(f"bias must be None or a contiguous ({N},) {x.dtype} tensor on {x.device}, got "
                         f"{getattr(bias, 'shape', bias)} {getattr(bias, 'dtype', '')}")
    if out_dtype is not None and out_dtype not in _FLOAT_DTYPES:
        raise ValueError(f"out_dtype must be None, float32, float16 or bfloat16, got {out_dtype}")
    if norm is not None and (not isinstance(norm, torch.Tensor) or norm.shape != (K,) or norm.dtype != x.dtype
                             or norm.device != x.device or not norm.is_contiguous()):
        raise ValueError(f"norm must be None or a contiguous ({K},) {x.dtype} tensor on {x.device} (the RMSNorm's "
                         f"weight), got {getattr(norm, 'shape', norm)} {getattr(norm, 'dtype', '')}")
    out = out_dtype or x.dtype
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != (x.shape[0], N)
                                 or residual.dtype != out or residual.device != x.device
                                 or residual.stride(-1) != 1):
        raise ValueError(f"residual must be None or a ({x.shape[0]}, {N}) {out} tensor on {x.device} with "
                         f"stride(-1) == 1, got {getattr(residual, 'shape', residual)} "
                         f"{getattr(residual, 'dtype', '')}")


def exact_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None, *, norm: Optional[torch.Tensor] = None,
                 eps: float = 1e-6, silu: bool = False, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Triton version of ``exact_linear_ref`` (same arguments; the same result up to the order
    of the fp32 sums, which is fixed: see the module's docstring). Returns a contiguous (M, N).
    Grid: (M / BLOCK_M, N / BLOCK_N), every program the whole K (twice with ``norm``: its rows'
    sums of squares first, in K order, so a row's norm does not depend on the step either).
    ``norm``, ``silu`` and ``residual`` fuse the layer's small steps into the product, one launch
    instead of two or three, rounded where their own kernels round (kernels/norm.py,
    kernels/elementwise.py, torch's add): with ``silu`` or ``residual`` the result is bit for bit
    that of the separate kernels; with ``norm`` the row's sum of squares is ordered otherwise
    than in ``rms_norm`` (a few ulps of the norm in fp32)."""
    _check(x, weight, bias, out_dtype, norm, silu, residual)
    M = x.shape[0]
    N, K = weight.shape
    out = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        out.copy_(bias.expand(M, N)) if bias is not None else out.zero_()
        return out if residual is None else out.copy_(residual + out)
    bm, bn, bk = TILE[x.dtype]
    _linear_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        x, weight, bias if bias is not None else weight, out,
        norm if norm is not None else weight, residual if residual is not None else out,
        M, N, K,
        x.stride(0), weight.stride(0), out.stride(0), residual.stride(0) if residual is not None else 0,
        float(eps),
        HAS_BIAS=bias is not None, NORM=norm is not None, SILU=bool(silu), RESIDUAL=residual is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        UPCAST_DOT=x.dtype != torch.float32 and x.device.type != "cuda",
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=3,
    )
    return out
