"""KV cache writes: ``kv_store`` (step K/V -> slots) and ``kv_compact`` (accepted K/V -> next
contiguous positions). Layout: see ``kernels/__init__``."""

import torch
import triton
import triton.language as tl

from kernels import checks
from kernels.elementwise import check_rows, rope_head, rope_ref


def kv_store_ref(
    k_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim), or with a leading num_layers
    v_cache: torch.Tensor,  # same shape as k_cache
    k: torch.Tensor,  # (T_total, n_kv_heads, head_dim), or (num_layers, T_total, ...) for 5-D caches
    v: torch.Tensor,  # same shape as k
    slot_mapping: torch.Tensor,  # (T_total,) int64/int32; slot = block * block_size + offset, -1 = skip
) -> None:
    if k_cache.dim() == 5:  # every layer's K/V into the same slots
        for layer in range(k_cache.shape[0]):
            kv_store_ref(k_cache[layer], v_cache[layer], k[layer], v[layer], slot_mapping)
        return
    nb, bs, n_kv, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(nb * bs, n_kv, d)[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(nb * bs, n_kv, d)[slots] = v[keep].to(v_cache.dtype)


def kv_compact_ref(
    k_cache: torch.Tensor,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim) or without layers
    v_cache: torch.Tensor,  # same shape as k_cache
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    context_lens: torch.Tensor,  # (B,) int32, committed length before the step
    accept_idx: torch.Tensor,  # (B, A) int32: step-relative indices of accepted tokens, increasing, -1 pad
    accept_counts: torch.Tensor,  # (B,) int32
) -> None:
    """For each sequence b and i < accept_counts[b]: position ctx + accept_idx[b, i] -> ctx + i.

    Indices are strictly increasing, so every source lies at or after its destination and a
    move in increasing i never overwrites a source still to be read. ``context_lens`` is not
    changed: the caller grows it by accept_counts.
    """
    k5 = k_cache if k_cache.dim() == 5 else k_cache.unsqueeze(0)
    v5 = v_cache if v_cache.dim() == 5 else v_cache.unsqueeze(0)
    bs = k5.shape[2]
    for b, (C, n) in enumerate(zip(context_lens.tolist(), accept_counts.tolist())):
        for i in range(n):
            src = C + int(accept_idx[b, i])
            dst = C + i
            if src == dst:
                continue
            sb, so = int(block_tables[b, src // bs]), src % bs
            db, do = int(block_tables[b, dst // bs]), dst % bs
            k5[:, db, do] = k5[:, sb, so]
            v5[:, db, do] = v5[:, sb, so]


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
# Both kernels copy rows of n_kv_heads * head_dim elements; a program moves one BLOCK-wide
# chunk of such rows (flattened head, dim index e), so big heads spread over several programs.


@triton.jit
def _kv_store_kernel(
    k_ptr,  # (num_layers, T_total, n_kv_heads, head_dim), cache dtype; num_layers = 1 for 4-D caches
    v_ptr,  # (num_layers, T_total, n_kv_heads, head_dim), cache dtype
    k_cache_ptr,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
    v_cache_ptr,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
    slot_mapping_ptr,  # (T_total,) int32/int64, -1 = skip
    block_size, head_dim, row_elems,  # row_elems = n_kv_heads * head_dim
    stride_kl, stride_kt, stride_kh,
    stride_vl, stride_vt, stride_vh,
    stride_kcl, stride_kcb, stride_kcs, stride_kch,
    stride_vcl, stride_vcb, stride_vcs, stride_vch,
    BLOCK: tl.constexpr,
):
    t, chunk = tl.program_id(0), tl.program_id(2)
    layer = tl.program_id(1).to(tl.int64)  # layer * layer stride of a big pool passes 2^31
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    e = chunk * BLOCK + tl.arange(0, BLOCK)
    # The scalar condition enters the mask through the limit (the CPU interpreter mistypes
    # `vector_bool & scalar_bool`).
    ok = e < tl.where(slot >= 0, row_elems, 0)
    h, d = e // head_dim, e % head_dim
    blk, off = slot // block_size, slot % block_size
    # k / v by strides: they are often views into a fused qkv projection.
    k = tl.load(k_ptr + layer * stride_kl + t * stride_kt + h * stride_kh + d, mask=ok)
    v = tl.load(v_ptr + layer * stride_vl + t * stride_vt + h * stride_vh + d, mask=ok)
    tl.store(k_cache_ptr + layer * stride_kcl + blk * stride_kcb + off * stride_kcs + h * stride_kch + d,
             k, mask=ok)
    tl.store(v_cache_ptr + layer * stride_vcl + blk * stride_vcb + off * stride_vcs + h * stride_vch + d,
             v, mask=ok)


# A commit runs eagerly after every step (never inside a CUDA graph) with a width that changes
# from step to step: the accepted tokens (max_accept, stride_ai) and the sequences' block-table
# columns (stride_bt). Triton would compile a variant for each of their values that is 1 or a
# multiple of 16, and the first decoding step to meet one paid that compile (0.1-0.25 s on an
# H200) inside its timed run. One variant serves them all; the kernel reads them as scalars.
@triton.jit(do_not_specialize=["max_accept", "stride_bt", "stride_ai"])
def _kv_compact_kernel(
    k_cache_ptr,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
    v_cache_ptr,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
    block_tables_ptr,  # (B, max_blocks) int32
    context_lens_ptr,  # (B,) int32
    accept_idx_ptr,  # (B, A) int32
    accept_counts_ptr,  # (B,) int32
    block_size, head_dim, row_elems, max_accept,  # row_elems = n_kv_heads * head_dim, max_accept = A
    stride_kcl, stride_kcb, stride_kcs, stride_kch,
    stride_vcl, stride_vcb, stride_vcs, stride_vch,
    stride_bt, stride_ai,
    BLOCK: tl.constexpr,
):
    b, chunk = tl.program_id(0), tl.program_id(2)
    layer = tl.program_id(1).to(tl.int64)  # layer * layer stride of a big pool passes 2^31
    C = tl.load(context_lens_ptr + b)
    n = tl.minimum(tl.load(accept_counts_ptr + b), max_accept)
    e = chunk * BLOCK + tl.arange(0, BLOCK)
    h, d = e // head_dim, e % head_dim
    k_base = k_cache_ptr + layer * stride_kcl + h * stride_kch + d
    v_base = v_cache_ptr + layer * stride_vcl + h * stride_vch + d
    # The moves of one sequence run in increasing i, inside one program: a source C + idx[i]
    # lies at or after its destination C + i and after every earlier destination, so no move
    # reads a slot an earlier move overwrote (a later one may, e.g. idx [0, 2, 3, 7]: move 1
    # reads position 2, move 2 then writes it). Parallel moves would race on exactly that.
    for i in range(0, n):
        src = C + tl.load(accept_idx_ptr + b * stride_ai + i)
        dst = C + i
        s_blk = tl.load(block_tables_ptr + b * stride_bt + src // block_size).to(tl.int64)
        d_blk = tl.load(block_tables_ptr + b * stride_bt + dst // block_size).to(tl.int64)
        ok = e < tl.where(src != dst, row_elems, 0)  # (see _kv_store_kernel on scalar masks)
        src_off = (src % block_size).to(tl.int64)
        dst_off = (dst % block_size).to(tl.int64)
        k = tl.load(k_base + s_blk * stride_kcb + src_off * stride_kcs, mask=ok)
        v = tl.load(v_base + s_blk * stride_vcb + src_off * stride_vcs, mask=ok)
        tl.store(k_base + d_blk * stride_kcb + dst_off * stride_kcs, k, mask=ok)
        tl.store(v_base + d_blk * stride_vcb + dst_off * stride_vcs, v, mask=ok)
        # Make this move's writes visible to every thread before the next move reads.
        tl.debug_barrier()


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_caches(k_cache, v_cache) -> None:
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(c, torch.Tensor) or c.dim() not in (4, 5):
            raise ValueError(f"{name} must be 4-D (num_blocks, block_size, n_kv_heads, head_dim) or 5-D "
                             f"(num_layers, ...), got {getattr(c, 'shape', c)}")
        if c.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16, got {c.dtype}")
        if c.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride(-1) == 1), got {c.stride()}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache {tuple(v_cache.shape)} "
                         f"{v_cache.dtype} must have the same shape and dtype")
    if v_cache.device != k_cache.device:
        raise ValueError(f"v_cache is on {v_cache.device} but k_cache is on {k_cache.device}")


def _check_index(name, x, dim, device, dtypes=(torch.int32,)) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes:
        raise ValueError(f"{name} must be a {' or '.join(map(str, dtypes))} tensor, got {getattr(x, 'dtype', x)}")
    if x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the caches are on {device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _as_5d(c: torch.Tensor) -> torch.Tensor:
    return c if c.dim() == 5 else c.unsqueeze(0)


def _row_block(row_elems: int) -> int:
    return min(1024, triton.next_power_of_2(row_elems))


def kv_store(
    k_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim), or with a leading num_layers
    v_cache: torch.Tensor,  # same shape as k_cache
    k: torch.Tensor,  # (T_total, n_kv_heads, head_dim), or (num_layers, T_total, ...) for 5-D caches
    v: torch.Tensor,  # same shape as k
    slot_mapping: torch.Tensor,  # (T_total,) int64/int32; slot = block * block_size + offset, -1 = skip
) -> None:
    """Triton version of ``kv_store_ref``. Grid: (T_total, num_layers, row chunks).
    k / v may be strided views (stride(-1) == 1); another float dtype is cast to the cache's.
    Slots must be < num_blocks * block_size: checked on a CPU, and on a GPU under
    SPECDEC_CHECK_VALUES=1 (kernels/checks.py: a host sync)."""
    _check_caches(k_cache, v_cache)
    dev = k_cache.device
    want = k_cache.dim() - 1
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != want:
            raise ValueError(f"{name} must be {want}-D for {k_cache.dim()}-D caches, got {getattr(x, 'shape', x)}")
        if x.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
        if x.device != dev:
            raise ValueError(f"{name} is on {x.device} but the caches are on {dev}")
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride(-1) == 1), got {x.stride()}")
        if x.shape[-2:] != k_cache.shape[-2:]:
            raise ValueError(f"{name} heads / head_dim {tuple(x.shape[-2:])} must match the cache's "
                             f"{tuple(k_cache.shape[-2:])}")
        if want == 4 and x.shape[0] != k_cache.shape[0]:
            raise ValueError(f"{name} has {x.shape[0]} layers, the caches {k_cache.shape[0]}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    _check_index("slot_mapping", slot_mapping, 1, dev, dtypes=(torch.int32, torch.int64))
    T_total = k.shape[-3]
    if slot_mapping.numel() != T_total:
        raise ValueError(f"slot_mapping must have T_total = {T_total} entries, got {slot_mapping.numel()}")
    if checks.wanted(slot_mapping):  # on a GPU only under SPECDEC_CHECK_VALUES=1 (a host sync)
        n_slots = k_cache.shape[-4] * k_cache.shape[-3]
        checks.in_range("slot_mapping", slot_mapping, -1, n_slots, f"-1 skips, the cache has {n_slots} slots")
    if k.dtype != k_cache.dtype:
        # Rare (the model stores in its own dtype); torch's cast rounds exactly as the reference's,
        # while Triton's interpreter truncates fp32 -> bf16.
        k, v = k.to(k_cache.dtype), v.to(k_cache.dtype)
    kc, vc = _as_5d(k_cache), _as_5d(v_cache)
    k4, v4 = (k, v) if want == 4 else (k.unsqueeze(0), v.unsqueeze(0))
    num_layers, _, block_size, n_kv, head_dim = kc.shape
    if T_total == 0 or num_layers == 0:
        return
    row = n_kv * head_dim
    block = _row_block(row)
    grid = (T_total, num_layers, triton.cdiv(row, block))
    _kv_store_kernel[grid](
        k4, v4, kc, vc, slot_mapping,
        block_size, head_dim, row,
        k4.stride(0), k4.stride(1), k4.stride(2),
        v4.stride(0), v4.stride(1), v4.stride(2),
        kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
        vc.stride(0), vc.stride(1), vc.stride(2), vc.stride(3),
        BLOCK=block,
    )


def kv_compact(
    k_cache: torch.Tensor,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim) or without layers
    v_cache: torch.Tensor,  # same shape as k_cache
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    context_lens: torch.Tensor,  # (B,) int32, committed length before the step
    accept_idx: torch.Tensor,  # (B, A) int32: step-relative indices of accepted tokens, increasing, -1 pad
    accept_counts: torch.Tensor,  # (B,) int32
) -> None:
    """Triton version of ``kv_compact_ref``: one launch moves every layer.
    Grid: (B, num_layers, row chunks); each program does its sequence's moves in order."""
    _check_caches(k_cache, v_cache)
    dev = k_cache.device
    _check_index("block_tables", block_tables, 2, dev)
    _check_index("context_lens", context_lens, 1, dev)
    _check_index("accept_idx", accept_idx, 2, dev)
    _check_index("accept_counts", accept_counts, 1, dev)
    B = block_tables.shape[0]
    if context_lens.numel() != B or accept_idx.shape[0] != B or accept_counts.numel() != B:
        raise ValueError(f"context_lens ({context_lens.numel()}), accept_idx rows ({accept_idx.shape[0]}) and "
                         f"accept_counts ({accept_counts.numel()}) must all equal B = block_tables rows = {B}")
    kc, vc = _as_5d(k_cache), _as_5d(v_cache)
    num_layers, num_blocks, block_size, n_kv, head_dim = kc.shape
    if B == 0 or accept_idx.shape[1] == 0 or num_layers == 0:
        return
    if checks.wanted(accept_idx):  # on a GPU only under SPECDEC_CHECK_VALUES=1 (a host sync)
        A = accept_idx.shape[1]
        checks.in_range("accept_counts", accept_counts, 0, A + 1, f"at most A = {A} accepted")
        checks.in_range("context_lens", context_lens, 0, 2**31 - 1, "committed tokens")
        needed = []
        for b, (row, n, c) in enumerate(zip(accept_idx.tolist(), accept_counts.tolist(), context_lens.tolist())):
            if any(x < 0 for x in row[:n]) or any(y <= x for x, y in zip(row[:n], row[1:n])):
                raise ValueError(f"accept_idx row {b}: its first {n} entries must be increasing step indices >= 0, "
                                 f"got {row[:n]}")
            needed.append(-(-(c + row[n - 1] + 1) // block_size) if n else 0)
        checks.block_tables("block_tables", block_tables, needed, num_blocks)
    row = n_kv * head_dim
    block = _row_block(row)
    grid = (B, num_layers, triton.cdiv(row, block))
    _kv_compact_kernel[grid](
        kc, vc, block_tables, context_lens, accept_idx, accept_counts,
        block_size, head_dim, row, accept_idx.shape[1],
        kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
        vc.stride(0), vc.stride(1), vc.stride(2), vc.stride(3),
        block_tables.stride(0), accept_idx.stride(0),
        BLOCK=block,
    )


# --------------------------------------------------------------------------------------------
# RoPE and the K/V store in one launch (the exact path's layer: docs/DESIGN.md, "The exact path")


def rope_store_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """``rope_ref`` of the q and k heads of the fused qkv rows (T, (heads + 2 kv_heads) D) in
    place, then ``kv_store_ref`` of the rotated k heads and the v heads into a layer's caches
    (num_blocks, block_size, kv_heads, D) at ``slot_mapping`` (-1 = skip)."""
    T, D = qkv.shape[0], k_cache.shape[-1]
    rope_ref(qkv, cos, sin, heads + kv_heads, D)
    k = qkv[:, heads * D:(heads + kv_heads) * D].view(T, kv_heads, D)
    v = qkv[:, (heads + kv_heads) * D:(heads + 2 * kv_heads) * D].view(T, kv_heads, D)
    kv_store_ref(k_cache, v_cache, k, v, slot_mapping)


@triton.jit
def _rope_store_kernel(x_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                       heads, kv_heads, half, head_dim, block_size,
                       stride_x, stride_c, stride_s, stride_cb, stride_cs, stride_ch,
                       BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    ok = d < half
    x = x_ptr + t * stride_x + h * head_dim
    y1, y2 = rope_head(x, cos_ptr + t * stride_c, sin_ptr + t * stride_s, half, d, ok)  # rope's, in place
    # a k head (h >= heads) with a slot: its rotated numbers and its v head into the caches. The
    # scalar conditions enter the mask through the limit (the CPU interpreter mistypes
    # `vector_bool & scalar_bool`)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    kvh = h - heads
    store = d < tl.where((kvh >= 0) & (slot >= 0), half, 0)
    cache = (slot // block_size) * stride_cb + (slot % block_size) * stride_cs + kvh.to(tl.int64) * stride_ch
    tl.store(k_cache_ptr + cache + d, y1, mask=store)
    tl.store(k_cache_ptr + cache + half + d, y2, mask=store)
    v = x + kv_heads * head_dim  # the v head of this k head
    tl.store(v_cache_ptr + cache + d, tl.load(v + d, mask=store, other=0.0), mask=store)
    tl.store(v_cache_ptr + cache + half + d, tl.load(v + half + d, mask=store, other=0.0), mask=store)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Triton version of ``rope_store_ref`` (same arguments, same result: ``rope``'s roundings,
    the store a copy), one launch where ``rope`` and ``kv_store`` take two. Grid: (rows, q and
    k heads). The caches are one layer's, 4-D, in qkv's dtype."""
    check_rows("qkv", qkv)
    _check_caches(k_cache, v_cache)
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be one layer's 4-D cache (num_blocks, block_size, n_kv_heads, head_dim), "
                         f"got {tuple(k_cache.shape)}")
    nb, bs, n_kv, D = k_cache.shape
    T = qkv.shape[0]
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads < 0 or kv_heads != n_kv:
        raise ValueError(f"heads must be an int >= 0 and kv_heads the caches' {n_kv}, got {heads!r}, {kv_heads!r}")
    if D % 2 or qkv.shape[1] < (heads + 2 * kv_heads) * D:
        raise ValueError(f"qkv rows must hold {heads} + 2 x {kv_heads} heads of {D} (an even head_dim), got "
                         f"{qkv.shape[1]} columns")
    if k_cache.dtype != qkv.dtype or k_cache.device != qkv.device:
        raise ValueError(f"the caches must be qkv's dtype and device ({qkv.dtype}, {qkv.device}), got "
                         f"{k_cache.dtype} on {k_cache.device}")
    for name, c in (("cos", cos), ("sin", sin)):
        if not isinstance(c, torch.Tensor) or c.shape != (T, D) or c.dtype != qkv.dtype \
                or c.device != qkv.device or c.stride(-1) != 1:
            raise ValueError(f"{name} must be a ({T}, {D}) {qkv.dtype} table on {qkv.device} "
                             f"(stride(-1) == 1), got {getattr(c, 'shape', c)} {getattr(c, 'dtype', '')}")
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache must have the same strides, got {k_cache.stride()} and "
                         f"{v_cache.stride()}")
    _check_index("slot_mapping", slot_mapping, 1, qkv.device, dtypes=(torch.int32, torch.int64))
    if slot_mapping.numel() != T:
        raise ValueError(f"slot_mapping must have {T} entries (one per row), got {slot_mapping.numel()}")
    if checks.wanted(slot_mapping):  # on a GPU only under SPECDEC_CHECK_VALUES=1 (a host sync)
        checks.in_range("slot_mapping", slot_mapping, -1, nb * bs, f"-1 skips, the cache has {nb * bs} slots")
    if T == 0 or heads + kv_heads == 0:
        return
    half = D // 2
    # no fused multiply-add: rope's roundings (kernels/elementwise.py)
    _rope_store_kernel[(T, heads + kv_heads)](
        qkv, cos, sin, k_cache, v_cache, slot_mapping,
        heads, kv_heads, half, D, bs,
        qkv.stride(0), cos.stride(0), sin.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        BLOCK=triton.next_power_of_2(half), enable_fp_fusion=False)
