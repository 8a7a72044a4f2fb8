"""Matrix products for few rows with block-quantized weights (GGUF's Q4_1 and Q8_0) on x86 CPUs:
the packing of a weight into the kernel's layout, the launcher (``quant_linear``) and the torch
references (``quant_linear_ref``, ``quantize_rows_ref``). The kernel is ``cpu/quant_gemm.c``,
built into kernels/skinny.py's one library.

Why: a decoding step on a small CPU streams every weight once, so its time is the weights'
bytes over the memory bandwidth. Q4_1 keeps 20 bytes per 32 weights in the file (fp32: 128);
the kernel reads 4 bits a weight and two fp16 scales a block, Q8_0 8 bits and one scale.

Formats, per block of 32 weights along K (the input dim):
  * ``q4_1``: w = d u + m, u in 0..15, d and m fp16: the GGUF file's own values, so the packed
    weight equals the file's dequantized fp32 weight exactly;
  * ``q8_0``: w = d q, q in -127..127 int8, d fp16: the LM head of the default model, and the
    form any fp32 weight is quantized to (``quantize_q8_0``).
The activations are quantized inside the call, each row per block to int8 with its own scale
(s = max |x| / 127, q = round(x * (1 / s)), ties to even), and the products summed exactly in
int32 before the scales: ``quant_linear_ref`` computes the same quantized rows and the exact
product of the two in float64, so the kernel differs from it only by the fp32 rounding of its
scaled sums. A row's result does not depend on the number of rows in the call, its place
among them or the thread count, bit for bit (the property that keeps greedy speculation
lossless; tests/test_kernel_quant.py checks it).
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from kernels import skinny

FORMATS = {"q4_1": 1, "q8_0": 2, "q4_1f": 3}  # the C file's QF_* codes
BLOCK = 32
_GGUF_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # d, (m,) quants


PANEL = 16  # rows of W a panel holds (cpu/quant_gemm.c)
PANEL_BLOCK_BYTES = {"q4_1": 320, "q8_0": 544, "q4_1f": 384}  # a panel's block: quants, then 16 d (and 16 m)
NIBBLES = ("q4_1", "q4_1f")  # w = d u + m, u in 0..15 (d, m fp16 / fp32)


@dataclass
class QuantWeight:
    """A weight (N, K) packed for ``quant_linear``: ``data`` (ceil(N / 16), K / 32, 320 or 544)
    uint8, its rows in panels of 16 (the last padded with zero weights), each panel's blocks in
    order, a block holding the 16 rows' quants interleaved 4 bytes a row and their fp16 scales
    (the layout: cpu/quant_gemm.c); ``n`` the true rows N."""

    format: str
    data: torch.Tensor
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.data.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes a product reads of the weight."""
        return self.data.numel()

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(u (N, K) int16 in plain order, d (N, K / 32) fp16 (q4_1f: fp32), m (N, K / 32) the
        same or None): w = d u + m (q4_1, q4_1f) or d (u - 128) (q8_0)."""
        p, nb, _ = self.data.shape
        n = self.n
        if self.format in NIBBLES:
            v = self.data[:, :, :256].reshape(p, nb, 4, PANEL, 4).to(torch.int16)  # (p, b, t, row, i)
            u = torch.stack([v & 15, v >> 4], 2)  # (p, b, half, t, row, i): element 16 half + 4 t + i
            u = u.permute(0, 4, 1, 2, 3, 5).reshape(p * PANEL, nb * BLOCK)
            scales = self.data[:, :, 256:].contiguous().view(torch.float16 if self.format == "q4_1" else
                                                             torch.float32)  # (p, b, 32): 16 d, 16 m
            d, m = scales[:, :, :PANEL], scales[:, :, PANEL:]
        else:
            v = self.data[:, :, :512].reshape(p, nb, 8, PANEL, 4).to(torch.int16)  # (p, b, c, row, i)
            u = v.permute(0, 3, 1, 2, 4).reshape(p * PANEL, nb * BLOCK)
            d, m = self.data[:, :, 512:].contiguous().view(torch.float16), None
        d, m = (None if t is None else t.permute(0, 2, 1).reshape(p * PANEL, nb)[:n].contiguous() for t in (d, m))
        return u[:n].contiguous(), d, m

    def dequantize(self) -> torch.Tensor:
        """The weight (N, K) fp32 it stands for (GGUF's dequantization, bit for bit)."""
        n, k = self.shape
        u, d, m = self.parts()
        u = u.float().view(n, k // BLOCK, BLOCK)
        df = d.float()[:, :, None]
        w = df * u + m.float()[:, :, None] if self.format in NIBBLES else df * (u - 128)
        return w.view(n, k)


def _pack(fmt: str, u: torch.Tensor, d: torch.Tensor, m: Optional[torch.Tensor] = None) -> QuantWeight:
    """u (N, K) values in plain order (0..15, or q + 128), d / m (N, K / 32) fp16 (q4_1f: fp32)
    -> the kernel's panels (in uint8, written in place: a model's weights pack in seconds)."""
    n, k = u.shape
    nb, p = k // BLOCK, -(-n // PANEL)
    sdt = torch.float32 if fmt == "q4_1f" else torch.float16
    sbytes = PANEL * sdt.itemsize  # a panel-block's 16 d (and 16 m)
    qb = PANEL_BLOCK_BYTES[fmt] - (2 * sbytes if fmt in NIBBLES else sbytes)  # quant bytes of a panel's block
    data = torch.empty(p, nb, PANEL_BLOCK_BYTES[fmt], dtype=torch.uint8)
    if p * PANEL != n:  # the padding rows: zero weights (u = 0 with d = m = 0 for q4_1, u = 128)
        full = torch.full((p * PANEL, k), 0 if fmt in NIBBLES else 128, dtype=torch.uint8)
        full[:n] = u
        u = full
    u = u.to(torch.uint8)
    if fmt in NIBBLES:
        v = u.view(p, PANEL, nb, 2, 4, 4).permute(0, 2, 3, 4, 1, 5)  # (p, b, half, t, row, i)
        torch.bitwise_or(v[:, :, 0], v[:, :, 1] << 4, out=data[:, :, :qb].view(p, nb, 4, PANEL, 4))
    else:
        data[:, :, :qb].view(p, nb, 8, PANEL, 4).copy_(u.view(p, PANEL, nb, 8, 4).permute(0, 2, 3, 1, 4))
    for i, t in enumerate(x for x in (d, m) if x is not None):  # 16 scales a block each, after the quants
        rows = torch.zeros(p * PANEL, nb, dtype=sdt)
        rows[:n] = t
        data[:, :, qb + sbytes * i:qb + sbytes * (i + 1)].view(p, nb, sbytes).copy_(
            rows.view(p, PANEL, nb).permute(0, 2, 1).contiguous().view(torch.uint8).view(p, nb, sbytes))
    return QuantWeight(fmt, data, n)


# GGUF's Q4_K super-block: 256 weights in 144 bytes (fp16 D, fp16 Dmin, 12 bytes of 6-bit scales, 128 of nibbles)
Q4_K_BLOCK, Q4_K_BYTES = 256, 144


def pack_q4_k(raw, shape: tuple[int, int]) -> QuantWeight:
    """A GGUF Q4_K tensor's bytes (N * K / 256 super-blocks of 144 bytes, rows in order) -> its
    ``q4_1f`` QuantWeight: each 32-weight sub-block j is w = (D sc_j) u - (Dmin mn_j), u its
    nibble (sub-block 2c: the low nibbles of bytes 32c..32c+31, 2c + 1 their high nibbles),
    sc_j / mn_j 6-bit, so d = D sc_j and m = -Dmin mn_j are exact in fp32 and the packed weight
    equals GGUF's dequantization (``gguf.quants.dequantize``) bit for bit."""
    n, k = shape
    if n < 1 or k < Q4_K_BLOCK or k % Q4_K_BLOCK:
        raise ValueError(f"shape must be (N, K) with N >= 1 and K a multiple of {Q4_K_BLOCK}, got {shape}")
    t = torch.from_numpy(np.ascontiguousarray(raw)) if isinstance(raw, np.ndarray) else raw
    sb = k // Q4_K_BLOCK
    if t.dtype != torch.uint8 or t.numel() != n * sb * Q4_K_BYTES:
        raise ValueError(f"raw must hold {n * sb * Q4_K_BYTES} uint8 bytes ({n} x {sb} blocks of {Q4_K_BYTES}), got "
                         f"{t.dtype} with {t.numel()}")
    t = t.reshape(n, sb, Q4_K_BYTES)
    D = t[:, :, 0:2].contiguous().view(torch.float16).float()  # (n, sb, 1)
    Dmin = t[:, :, 2:4].contiguous().view(torch.float16).float()
    q = t[:, :, 4:16].to(torch.int32)  # the 12 scale bytes
    lo, mid, hi = q[:, :, 0:4], q[:, :, 4:8], q[:, :, 8:12]
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], 2)  # (n, sb, 8)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], 2)
    qs = t[:, :, 16:].reshape(n, sb, 4, 1, 32)
    u = torch.cat([qs & 15, qs >> 4], 3)  # (n, sb, chunk, nibble, 32): sub-block 2 chunk + nibble
    d = (D * sc.float()).reshape(n, k // BLOCK)
    m = -(Dmin * mn.float()).reshape(n, k // BLOCK)
    return _pack("q4_1f", u.reshape(n, k), d, m)


def pack_gguf(raw, fmt: str, shape: tuple[int, int]) -> QuantWeight:
    """A GGUF tensor's block bytes (a numpy / torch uint8 array of N * K / 32 blocks, rows in
    order; GGUF's ``tensor.data``) of format ``fmt`` ("q4_1": fp16 d, fp16 m, 16 bytes of
    nibbles, byte j = elements j and j + 16; "q8_0": fp16 d, 32 int8; "q4_k": ``pack_q4_k``)
    -> its QuantWeight."""
    if fmt == "q4_k":
        return pack_q4_k(raw, shape)
    if fmt not in _GGUF_BLOCK_BYTES:
        raise ValueError(f"fmt must be one of {', '.join(_GGUF_BLOCK_BYTES)} or q4_k, got {fmt!r}")
    n, k = shape
    if n < 1 or k < BLOCK or k % BLOCK:
        raise ValueError(f"shape must be (N, K) with N >= 1 and K a multiple of {BLOCK}, got {shape}")
    t = torch.from_numpy(np.ascontiguousarray(raw)) if isinstance(raw, np.ndarray) else raw
    nb, bb = k // BLOCK, _GGUF_BLOCK_BYTES[fmt]
    if t.dtype != torch.uint8 or t.numel() != n * nb * bb:
        raise ValueError(f"raw must hold {n * nb * bb} uint8 bytes ({n} x {nb} blocks of {bb}), got {t.dtype} "
                         f"with {t.numel()}")
    t = t.reshape(n, nb, bb)
    d = t[:, :, :2].contiguous().view(torch.float16).view(n, nb)
    if fmt == "q4_1":
        m = t[:, :, 2:4].contiguous().view(torch.float16).view(n, nb)
        qs, u = t[:, :, 4:], torch.empty(n, nb, BLOCK, dtype=torch.uint8)
        torch.bitwise_and(qs, 15, out=u[:, :, :16])  # byte j holds elements j and j + 16
        torch.bitwise_right_shift(qs, 4, out=u[:, :, 16:])
        return _pack(fmt, u.view(n, k), d, m)
    return _pack(fmt, t[:, :, 2:].reshape(n, k) ^ 0x80, d)  # int8 q's bits ^ 0x80 = q + 128 in uint8


def quantize_q8_0(weight: torch.Tensor) -> QuantWeight:
    """An fp32 weight (N, K), K a multiple of 32, quantized to q8_0 by llama.cpp's rule (gguf's
    ``quantize``, bit for bit): per block d = max |w| / 127, q = round(w * (1 / d)) with halves
    away from zero, stored d = fp16(d)."""
    w = _check_weight(weight)
    n, k = w.shape
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    d = blocks.abs().amax(2) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = _round_away(blocks * inv[:, :, None]).clamp(-127, 127).view(n, k)
    return _pack("q8_0", q + 128, d.to(torch.float16))


def _round_away(t: torch.Tensor) -> torch.Tensor:
    """Round to nearest, halves away from zero (C's roundf, llama.cpp's quantizers)."""
    return torch.sign(t) * torch.floor(t.abs() + 0.5)


def quantize_q4_1(weight: torch.Tensor) -> QuantWeight:
    """An fp32 weight (N, K) quantized to q4_1 (per block m = fp16(min), d = fp16((max - min) /
    15), u = round((w - m) / d) in 0..15): for tests and for a model without a Q4_1 file."""
    w = _check_weight(weight)
    n, k = w.shape
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    lo, hi = blocks.amin(2), blocks.amax(2)
    d, m = ((hi - lo) / 15).to(torch.float16), lo.to(torch.float16)
    df = d.float()
    inv = torch.where(df > 0, 1 / df, torch.zeros_like(df))
    u = _round_away((blocks - m.float()[:, :, None]) * inv[:, :, None]).clamp(0, 15).view(n, k)
    return _pack("q4_1", u, d, m)


def _check_weight(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2 or weight.shape[1] % BLOCK or weight.shape[1] < BLOCK or weight.shape[0] < 1:
        raise ValueError(f"weight must be (N, K) with N >= 1 and K a multiple of {BLOCK}, got {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise ValueError(f"weight must be a floating-point tensor, got {weight.dtype}")
    return weight.detach().float().cpu()


def check_weight(w: QuantWeight, name: str = "weight") -> tuple[int, int]:
    """A QuantWeight's data agrees with its format and row count; -> (N, K)."""
    if not isinstance(w, QuantWeight) or w.format not in FORMATS:
        raise ValueError(f"{name} must be a QuantWeight of format {' or '.join(FORMATS)}, got "
                         f"{getattr(w, 'format', type(w).__name__)!r}")
    t, bpb = w.data, PANEL_BLOCK_BYTES[w.format]
    if (t.dtype != torch.uint8 or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 3
            or t.shape[2] != bpb or t.shape[1] < 1 or not isinstance(w.n, int) or not 1 <= w.n
            or -(-w.n // PANEL) != t.shape[0]):
        raise ValueError(f"{name}.data must be a contiguous uint8 CPU tensor (ceil(n / {PANEL}), K / {BLOCK}, {bpb}) "
                         f"for {w.format}, got {t.dtype} {tuple(t.shape)} on {t.device} with n={w.n!r}")
    return w.n, t.shape[1] * BLOCK


def quant_linear(x: torch.Tensor, weight: QuantWeight, bias: Optional[torch.Tensor] = None,
                 threads: Optional[int] = None) -> torch.Tensor:
    """x (M, K) fp32 CPU (rows may be strided, each contiguous) @ the quantized weight (N, K).T
    + bias (N,) -> (M, N) fp32, the rows of x quantized per block inside the call. ``threads``:
    OpenMP threads over the rows of W (default torch's)."""
    lib = skinny._require()
    n, k = check_weight(weight)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (M, {k}) for a weight of K={k}, got {tuple(x.shape)}")
    if x.dtype != torch.float32 or x.device.type != "cpu" or (x.stride(1) != 1 and x.shape[1] > 1):
        raise ValueError(f"x must be a float32 CPU tensor with contiguous rows, got {x.dtype} on {x.device} "
                         f"with strides {x.stride()}")
    if bias is not None and (bias.shape != (n,) or bias.dtype != torch.float32 or bias.device.type != "cpu"
                             or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous float32 CPU tensor of shape ({n},), got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    threads = skinny._threads(threads)
    return linear_unchecked(lib, x, weight, bias, threads)


def linear_unchecked(lib, x: torch.Tensor, w: QuantWeight, bias: Optional[torch.Tensor], threads: int) -> torch.Tensor:
    """``quant_linear`` without the checks, for callers that built the arguments."""
    m, k = x.shape
    n = w.n
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        rc = lib.quant_linear(x.data_ptr(), x.stride(0), FORMATS[w.format], w.data.data_ptr(),
                              None if bias is None else bias.data_ptr(), y.data_ptr(), m, n, k, threads)
        if rc != 0:
            raise MemoryError(f"quant_linear could not allocate its buffers (M={m}, K={k})")
    return y


def quant_linear_topk(x: torch.Tensor, weight: QuantWeight, k: int = 1, threads: Optional[int] = None
                      ) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """``quant_linear(x, weight)`` (an LM head's logits y) with every row's argmax and top-``k``
    from the same call: (y, argmax per row, top-k per row). Each thread ranks the part of every
    row it wrote while it is in its cache, instead of a pass over y after the product (a row of a
    49k vocabulary: 196 KB). The answers are ``kernels.rows.argmax_topk_rows(y, k)``'s, equal
    values in index order; a row holding a NaN gets torch's (tests/test_kernel_quant.py)."""
    lib = skinny._require()
    n, kk = check_weight(weight)
    if x.dim() != 2 or x.shape[1] != kk or x.dtype != torch.float32 or x.device.type != "cpu" or (
            x.stride(1) != 1 and x.shape[1] > 1):
        raise ValueError(f"x must be a float32 CPU (M, {kk}) tensor with contiguous rows, got {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(skinny.MAX_TOPK, n):
        raise ValueError(f"k must be an int in [1, {min(skinny.MAX_TOPK, n)}], got {k!r}")
    return topk_unchecked(lib, x, weight, k, skinny._threads(threads))


def topk_unchecked(lib, x: torch.Tensor, w: QuantWeight, k: int, threads: int
                   ) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """``quant_linear_topk`` without the checks, for callers that built the arguments."""
    m, kdim = x.shape
    y = torch.empty(m, w.n, dtype=torch.float32)
    idx = torch.empty(m, k, dtype=torch.int64)
    bad = torch.empty(m, dtype=torch.int64)
    if m == 0:
        return y, [], []
    n_bad = lib.quant_linear_topk(x.data_ptr(), x.stride(0), FORMATS[w.format], w.data.data_ptr(), None,
                                  y.data_ptr(), m, w.n, kdim, threads, k, idx.data_ptr(), bad.data_ptr())
    if n_bad < 0:
        raise MemoryError(f"quant_linear_topk could not allocate its buffers (M={m}, K={kdim})")
    top = idx.tolist()
    top1 = [t[0] for t in top]
    for r in bad[:n_bad].tolist():  # a NaN in the row: torch's answers (NaN ranks above every number)
        top[r], top1[r] = y[r].topk(k).indices.tolist(), int(y[r].argmax())
    return y, top1, top


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's own quantization of x's rows (M, K): (q (M, K) int8, s (M, K / 32) fp32)."""
    lib = skinny._require()
    if x.dim() != 2 or x.shape[1] % BLOCK or x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(1) != 1:
        raise ValueError(f"x must be a float32 CPU (M, K) tensor with contiguous rows, K a multiple of {BLOCK}, got "
                         f"{x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8)
    s = torch.empty(m, k // BLOCK, dtype=torch.float32)
    lib.quant_rows(x.data_ptr(), x.stride(0), m, k, q.data_ptr(), s.data_ptr())
    return q, s


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of the activations' quantization: per block s = max |x| / 127 and
    q = round(x * (1 / s)) (fp32, ties to even), 0 for an all-zero block."""
    m, k = x.shape
    b = x.float().reshape(m, k // BLOCK, BLOCK)
    s = b.abs().amax(2) / 127
    inv = torch.where(s != 0, 1 / s, torch.zeros_like(s))
    q = (b * inv[:, :, None]).round().to(torch.int8).view(m, k)
    return q, s


def quant_linear_ref(x: torch.Tensor, weight: QuantWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference: x's rows quantized as the kernel does, times the dequantized weight, exact
    in float64, rounded to fp32."""
    q, s = quantize_rows_ref(x)
    m, k = x.shape
    xq = (q.double().view(m, k // BLOCK, BLOCK) * s.double()[:, :, None]).view(m, k)
    y = xq @ weight.dequantize().double().T
    return (y if bias is None else y + bias.double()).float()


def vnni() -> bool:
    """Whether the active build takes the integer dot products with AVX512-VNNI."""
    lib = skinny._load()
    return lib is not None and lib.quant_vnni() == 1
