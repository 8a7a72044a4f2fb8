"""The forward's remaining small elementwise steps, one launch each: ``rope`` (rotate the q and
k heads of the fused qkv rows in place) and ``silu_mul`` (silu(gate) * up), each beside its
torch reference.

In torch, RoPE is four launches per layer (two products, the half swap, the sum) and
silu * up two; on a GPU at small step sizes each launch costs more host time than its work
(docs/DESIGN.md, "The GPU path"). The kernels round exactly where torch's ops round: every product
and sum is formed in fp32 and rounded to the tensor's dtype, as torch's elementwise ops on a
GPU do, so 16-bit results are those of the torch ops bit for bit there (silu's exponential
aside: one rounding step at most). The CPU interpreter truncates instead of rounding when it
casts to bf16; tests allow that step there.
"""

import torch
import triton
import triton.language as tl

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rope_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """Rotate heads 0 .. heads-1 of every row of ``qkv`` (T, >= heads * head_dim) in place, the
    two halves of each head (the "NeoX" layout): [x1 cos - x2 sin, x2 cos + x1 sin], with
    ``cos`` / signed ``sin`` (T, head_dim) full-width tables ([cos, cos], [-sin, sin])."""
    T, D, half = qkv.shape[0], head_dim, head_dim // 2
    x = qkv[:, :heads * D].view(T, heads, D)
    c, s = cos.view(T, 1, D), sin.view(T, 1, D)
    x.copy_(x * c + torch.cat([x[..., half:], x[..., :half]], -1) * s)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2I) gate and up side by side -> silu(gate) * up (T, I)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@triton.jit
def rope_head(x, cos_row, sin_row, half, d, ok):
    """One head's RoPE in place (x: its first element; cos_row / sin_row: the row's tables; d < half
    where ok): each product rounded to x's dtype, then their sum, as torch's ops round. Returns the
    rotated halves (``kv_ops.rope_store`` stores them into the cache too)."""
    x1 = tl.load(x + d, mask=ok, other=0.0)
    x2 = tl.load(x + half + d, mask=ok, other=0.0)
    c1 = tl.load(cos_row + d, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_row + half + d, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row + d, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_row + half + d, mask=ok, other=0.0).to(tl.float32)
    dt = x1.dtype
    a1, b1 = (x1.to(tl.float32) * c1).to(dt), (x2.to(tl.float32) * s1).to(dt)  # rounded as torch's products
    a2, b2 = (x2.to(tl.float32) * c2).to(dt), (x1.to(tl.float32) * s2).to(dt)
    y1 = (a1.to(tl.float32) + b1.to(tl.float32)).to(dt)
    y2 = (a2.to(tl.float32) + b2.to(tl.float32)).to(dt)
    tl.store(x + d, y1, mask=ok)
    tl.store(x + half + d, y2, mask=ok)
    return y1, y2


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, half, stride_x, stride_c, stride_s, head_dim, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    rope_head(x_ptr + t * stride_x + h * head_dim, cos_ptr + t * stride_c, sin_ptr + t * stride_s, half, d, d < half)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n, stride_gu, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = e < n
    g = tl.load(gu_ptr + t * stride_gu + e, mask=ok, other=0.0)
    u = tl.load(gu_ptr + t * stride_gu + n + e, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    tl.store(out_ptr + t * stride_o + e, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=ok)


def check_rows(name: str, x) -> None:
    """A 2-D float tensor contiguous along its rows (rows may be strided), or a ValueError naming it."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor (rows, n), got {getattr(x, 'shape', x)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along its rows (stride(-1) == 1), got {x.stride()}")


def rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """Triton version of ``rope_ref`` (same arguments, same result). Grid: (rows, heads)."""
    check_rows("qkv", qkv)
    T = qkv.shape[0]
    if not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even int >= 2, got {head_dim!r}")
    if not isinstance(heads, int) or heads < 0 or heads * head_dim > qkv.shape[1]:
        raise ValueError(f"heads * head_dim must fit a row of qkv ({qkv.shape[1]}), got {heads} x {head_dim}")
    for name, c in (("cos", cos), ("sin", sin)):
        if not isinstance(c, torch.Tensor) or c.shape != (T, head_dim) or c.dtype != qkv.dtype \
                or c.device != qkv.device or c.stride(-1) != 1:
            raise ValueError(f"{name} must be a ({T}, {head_dim}) {qkv.dtype} table on {qkv.device} "
                             f"(stride(-1) == 1), got {getattr(c, 'shape', c)} {getattr(c, 'dtype', '')}")
    if T == 0 or heads == 0:
        return
    half = head_dim // 2
    # no fused multiply-add: torch rounds each product before the sum, and so must we (with
    # fusion on, the GPU build differed from rope_ref by an ulp in all three dtypes)
    _rope_kernel[(T, heads)](qkv, cos, sin, half, qkv.stride(0), cos.stride(0), sin.stride(0), head_dim,
                             BLOCK=triton.next_power_of_2(half), enable_fp_fusion=False)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Triton version of ``silu_mul_ref``. Grid: (rows, column blocks)."""
    check_rows("gate_up", gate_up)
    T, n2 = gate_up.shape
    if n2 % 2:
        raise ValueError(f"gate_up must have an even number of columns (gate and up), got {n2}")
    n = n2 // 2
    out = torch.empty(T, n, dtype=gate_up.dtype, device=gate_up.device)
    if T and n:
        block = min(1024, triton.next_power_of_2(n))
        _silu_mul_kernel[(T, triton.cdiv(n, block))](gate_up, out, n, gate_up.stride(0), out.stride(0), BLOCK=block)
    return out
