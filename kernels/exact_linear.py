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

from kernels.elementwise import check_rows

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (BLOCK_M, BLOCK_N, BLOCK_K) by input dtype: one tile for every row count
TILE = {torch.bfloat16: (16, 64, 128), torch.float16: (16, 64, 128), torch.float32: (16, 64, 64)}


def exact_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T + bias (N,) -> (M, N) in ``out_dtype`` (default x's), formed
    in fp32 and rounded once."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)


# M is not specialised: Triton would otherwise compile (and may generate) another variant for
# M == 1 and for M divisible by 16; one variant serves every step width
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    x_ptr,  # (M, K), rows strided, stride(-1) == 1
    w_ptr,  # (N, K), stride(-1) == 1: nn.Linear's weight
    b_ptr,  # (N,); read only when HAS_BIAS
    out_ptr,  # (M, N), stride(-1) == 1
    M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST_DOT: tl.constexpr,  # the CPU interpreter: dot in fp32 (its 16-bit dots are wrong)
    DOT_PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K in order, one accumulator: the same sequence of additions for every row and step width.
    # Past K the loads give 0, whose products add exact zeros.
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)  # (BLOCK_M, BLOCK_K)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0)  # (BLOCK_K, BLOCK_N): W's rows as columns
        if UPCAST_DOT:
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def _check(x, weight, bias, out_dtype) -> None:
    check_rows("x", x)
    K = x.shape[1]
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


def exact_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Triton version of ``exact_linear_ref`` (same arguments; the same result up to the order
    of the fp32 sums, which is fixed: see the module's docstring). Returns a contiguous (M, N).
    Grid: (M / BLOCK_M, N / BLOCK_N), every program the whole K."""
    _check(x, weight, bias, out_dtype)
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.copy_(bias.expand(M, N)) if bias is not None else out.zero_()
    bm, bn, bk = TILE[x.dtype]
    _linear_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        x, weight, bias if bias is not None else weight, out,
        M, N, K,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        UPCAST_DOT=x.dtype != torch.float32 and x.device.type != "cuda",
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=3,
    )
    return out
