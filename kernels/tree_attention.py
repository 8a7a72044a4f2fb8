"""Attention of packed step queries over a paged KV cache under a per-step visibility mask.

One kernel serves prefill (causal), decode (T = 1), tree verification and the lookahead
window (bitmask), for a batch that mixes them. Layout: see ``kernels/__init__``.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from kernels import checks
from kernels.mask import unpack_mask

MAX_MASK_WORDS = 32  # step masks cover at most 32 * 32 = 1024 step tokens
MAX_GROUP = 128  # query heads per KV head that fit in one tile
MAX_SPLITS = 64  # prefix key ranges per sequence (split-KV decode)


def tree_attention_ref(
    q: torch.Tensor,  # (T_total, n_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim)
    cu_seqlens_q: torch.Tensor,  # (B + 1,) int32
    positions: torch.Tensor,  # (T_total,) int32
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    context_lens: torch.Tensor,  # (B,) int32
    mask: Optional[torch.Tensor] = None,  # (T_total, n_words) int32 or None (= all causal)
    causal: Optional[torch.Tensor] = None,  # (B,) bool: True -> causal rule, mask rows ignored
    scale: Optional[float] = None,
    sliding_window: Optional[int] = None,
    max_seqlen_q: Optional[int] = None,  # unused here; the Triton launcher sizes its grid with it
) -> torch.Tensor:  # (T_total, n_heads, head_dim), dtype of q
    """Plain-torch reference (fp32 math). Also the ``torch`` backend's attention."""
    T_total, n_heads, head_dim = q.shape
    block_size, n_kv = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // n_kv
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    is_causal = [True] * (len(cu) - 1) if mask is None else (
        [False] * (len(cu) - 1) if causal is None else causal.tolist())
    for b in range(len(cu) - 1):
        s, e, C = cu[b], cu[b + 1], ctx[b]
        T = e - s
        if T == 0:
            continue
        L = C + T
        n_blk = -(-L // block_size)
        blocks = block_tables[b, :n_blk].long()
        first = int(blocks[0])
        if q.device.type == "cpu" and blocks.tolist() == list(range(first, first + n_blk)):
            # consecutive blocks (common on one sequence): a view, no gather
            k = k_cache[first:first + n_blk].reshape(n_blk * block_size, n_kv, head_dim)[:L]
            v = v_cache[first:first + n_blk].reshape(n_blk * block_size, n_kv, head_dim)[:L]
        else:
            k = k_cache[blocks].reshape(n_blk * block_size, n_kv, head_dim)[:L]  # (L, n_kv, D)
            v = v_cache[blocks].reshape(n_blk * block_size, n_kv, head_dim)[:L]
        # vis = None means "every key visible" (a decode row, or a whole causal prefill),
        # which lets SDPA skip the mask; otherwise (T, L) bool.
        vis, causal_flag = None, False
        if is_causal[b]:
            if T > 1 and C == 0 and sliding_window is None:
                causal_flag = True  # SDPA's own causal path: no mask tensor at all
            elif T > 1:
                vis = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(diagonal=C)
        else:
            vis = torch.ones(T, L, dtype=torch.bool, device=q.device)
            vis[:, C:] = unpack_mask(mask[s:e], T)
        if sliding_window is not None:
            q_pos = positions[s:e].long()
            k_pos = torch.cat([torch.arange(C, device=q.device), q_pos])
            in_window = (q_pos[:, None] - k_pos[None, :]) < sliding_window
            vis = in_window if vis is None else vis & in_window
        # 4-D inputs and SDPA's own GQA: on a CPU this takes the fused kernel (3-D inputs or
        # repeated K/V fall back to the math path, measured 5x slower for decode at 2k keys).
        qf = q[s:e].float().transpose(0, 1)[None]  # (1, H, T, D)
        kf = k.float().transpose(0, 1)[None]  # (1, n_kv, L, D)
        vf = v.float().transpose(0, 1)[None]
        o = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=vis, is_causal=causal_flag,
                                                             scale=scale, enable_gqa=group > 1)
        out[s:e] = o[0].transpose(0, 1).to(q.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------
# Flash-attention style (online softmax, Dao et al. 2022) over a paged cache, with the query
# heads of one KV head packed into the M dimension of a tile (GQA): row m of a tile is step
# token t0 + m // GROUP, query head kv_head * GROUP + m % GROUP. Every K/V tile is then loaded
# once per KV head and used by all the query heads that share it, which is what makes decode
# (T = 1, where a tile would otherwise hold a single row) read the cache only once.


@triton.jit
def _attend_tile(
    acc, l_i, m_i,  # (BLOCK_M, BLOCK_D) fp32, (BLOCK_M,) fp32, (BLOCK_M,) fp32: running state
    q,  # (BLOCK_M, BLOCK_D) q dtype
    k_cache_ptr, v_cache_ptr,  # (num_blocks, block_size, n_kv_heads, head_dim)
    block_table_row,  # pointer to block_tables[b, 0]
    key_idx,  # (BLOCK_N,) logical key positions of this tile
    key_ok,  # (BLOCK_N,) keys that exist
    vis,  # (BLOCK_M, BLOCK_N) bool: visibility (already including key_ok)
    kv_head, sm_scale_log2, block_size, head_dim,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_D: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Paged gather: each key finds its physical block through the block table, so BLOCK_N is
    # independent of the cache's block_size. int64 because block * stride can pass 2^31.
    blk = tl.load(block_table_row + key_idx // block_size, mask=key_ok, other=0).to(tl.int64)
    off = key_idx % block_size
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = key_ok[:, None] & (offs_d[None, :] < head_dim)
    k = tl.load(k_cache_ptr + (blk * stride_kb + off * stride_ks + kv_head * stride_kh)[:, None] + offs_d[None, :],
                mask=kv_ok, other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(v_cache_ptr + (blk * stride_vb + off * stride_vs + kv_head * stride_vh)[:, None] + offs_d[None, :],
                mask=kv_ok, other=0.0)  # (BLOCK_N, BLOCK_D)
    if UPCAST_DOT:
        # Triton's CPU interpreter mis-computes bf16 dots; fp32 operands give the same result
        # a bf16 tensor-core dot (fp32 accumulate) would.
        qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    # Base-2 softmax: the scale carries log2(e) so exp2 replaces exp.
    qk = tl.where(vis, qk * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row with nothing visible yet keeps m = -inf; subtracting 0 instead avoids inf - inf.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # p is rounded to the cache dtype for the second dot, as flash attention does.
    p = p.to(v.dtype)
    if UPCAST_DOT:
        pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p, v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv
    return acc, l_i, m_new


@triton.jit
def _tree_attention_kernel(
    q_ptr,  # (T_total, n_heads, head_dim)
    k_cache_ptr,  # (num_blocks, block_size, n_kv_heads, head_dim)
    v_cache_ptr,  # (num_blocks, block_size, n_kv_heads, head_dim)
    out_ptr,  # (T_total, n_heads, head_dim); written when NUM_SPLITS == 1
    o_part_ptr,  # (NUM_SPLITS, T_total, n_heads, head_dim) fp32: per-split normalised outputs
    lse_part_ptr,  # (NUM_SPLITS, T_total, n_heads) fp32: per-split log2-sum-exp2 of the scores
    cu_seqlens_ptr,  # (B + 1,) int32
    positions_ptr,  # (T_total,) int32
    block_tables_ptr,  # (B, max_blocks) int32
    context_lens_ptr,  # (B,) int32
    mask_ptr,  # (T_total, n_words) int32; read only by sequences under the mask rule
    causal_ptr,  # (B,) int8; read only when MASK_MODE == 2
    order_ptr,  # (T_total, n_words * 32) int32: a masked row's visible step keys in order (EXACT)
    count_ptr,  # (T_total,) int32: how many (EXACT)
    sm_scale_log2,  # softmax scale * log2(e)
    sliding_window,  # keys with q_pos - k_pos >= sliding_window are invisible (HAS_WINDOW)
    block_size, n_words, head_dim,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_bt,
    stride_mt,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt,
    stride_order,
    NUM_SPLITS: tl.constexpr,  # > 1: the prefix is cut into NUM_SPLITS key ranges (flash decoding)
    GROUP: tl.constexpr,  # query heads per KV head
    TOKENS_PER_TILE: tl.constexpr,  # BLOCK_M // GROUP step tokens per tile
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # head_dim padded to a power of two
    MASK_MODE: tl.constexpr,  # 0: every sequence causal, 1: every sequence masked, 2: per-sequence flag
    HAS_WINDOW: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EXACT: tl.constexpr,  # every row's keys by rank (see ``tree_attention``); TOKENS_PER_TILE 1 under a mask
):
    tile, b = tl.program_id(0), tl.program_id(1)
    kv_head, split = tl.program_id(2) // NUM_SPLITS, tl.program_id(2) % NUM_SPLITS
    q_start = tl.load(cu_seqlens_ptr + b)
    T = tl.load(cu_seqlens_ptr + b + 1) - q_start
    t0 = tile * TOKENS_PER_TILE
    # The grid is sized for the longest step of the batch; shorter steps leave tiles idle.
    if t0 >= T:
        return
    C = tl.load(context_lens_ptr + b)
    block_table_row = block_tables_ptr + b * stride_bt

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    t = t0 + offs_m // GROUP  # (BLOCK_M,) step-relative token of each row
    head = kv_head * GROUP + offs_m % GROUP  # (BLOCK_M,) query head of each row
    row_ok = (offs_m < TOKENS_PER_TILE * GROUP) & (t < T)
    row = (q_start + t).to(tl.int64)
    q_off = row[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    io_ok = row_ok[:, None] & (offs_d[None, :] < head_dim)
    q = tl.load(q_ptr + q_off, mask=io_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
    pos_q = tl.load(positions_ptr + q_start + t, mask=row_ok, other=0)  # (BLOCK_M,)

    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)

    if MASK_MODE == 0:
        is_causal = True
    elif MASK_MODE == 1:
        is_causal = False
    else:
        is_causal = tl.load(causal_ptr + b) != 0

    if EXACT:
        # ---- every key a row sees, as one sequence by rank: the prefix (rank = position), then
        # its visible step keys in step order; tiles of BLOCK_N ranks from rank 0. A decoding
        # row and a tree row over the same keys then meet them in the same tiles in the same
        # order, whatever else the step holds. Keys past a row's last rank are masked: exact zeros.
        if is_causal:
            n_keys = C + tl.minimum(T, t0 + TOKENS_PER_TILE)  # up to the tile's last row
        else:  # one step token per tile: its own count
            n_keys = C + tl.load(count_ptr + q_start + t0)
        lo = 0
        if HAS_WINDOW:
            # leading prefix tiles outside every row's window: skipping them changes nothing
            min_pos = tl.min(tl.where(row_ok, pos_q, 2147483647))
            lo = (tl.minimum(tl.maximum(min_pos - sliding_window + 1, 0), C) // BLOCK_N) * BLOCK_N
        order_row = order_ptr + (q_start + t0).to(tl.int64) * stride_order
        for r0 in range(lo, n_keys, BLOCK_N):
            r = r0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) ranks
            j = r - C  # rank among the step keys; < 0: a prefix key
            key_ok = r < n_keys
            if is_causal:
                s = j
                vis = key_ok[None, :] & row_ok[:, None] & (j[None, :] <= t[:, None])
            else:
                s = tl.load(order_row + j, mask=key_ok & (j >= 0), other=0)
                vis = key_ok[None, :] & row_ok[:, None]
            key_idx = tl.where(j < 0, r, C + s)
            if HAS_WINDOW:
                pos_k = tl.where(j < 0, r, tl.load(positions_ptr + q_start + s, mask=key_ok & (j >= 0), other=0))
                vis = vis & ((pos_q[:, None] - pos_k[None, :]) < sliding_window)
            acc, l_i, m_i = _attend_tile(
                acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, block_table_row, key_idx, key_ok, vis,
                kv_head, sm_scale_log2, block_size, head_dim,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_D, UPCAST_DOT, DOT_PRECISION)
    else:
        # ---- phase 1: the committed prefix, visible to every step token (window aside) ----
        prefix_end = C
        lo = 0
        if NUM_SPLITS > 1:
            # Few programs (decode, small batch) cannot fill the GPU: each split takes one
            # BLOCK_N-aligned range of this sequence's prefix, and a second kernel merges them.
            chunk = tl.cdiv(tl.cdiv(C, NUM_SPLITS), BLOCK_N) * BLOCK_N
            lo = split * chunk
            prefix_end = tl.minimum(C, lo + chunk)
        if HAS_WINDOW:
            # Skip prefix tiles that slid out of the window of every row of this tile.
            min_pos = tl.min(tl.where(row_ok, pos_q, 2147483647))
            lo = tl.maximum(lo, (tl.maximum(min_pos - sliding_window + 1, 0) // BLOCK_N) * BLOCK_N)
        for start_n in range(lo, prefix_end, BLOCK_N):
            key_idx = start_n + tl.arange(0, BLOCK_N)
            key_ok = key_idx < prefix_end
            vis = key_ok[None, :] & row_ok[:, None]
            if HAS_WINDOW:
                vis = vis & ((pos_q[:, None] - key_idx[None, :]) < sliding_window)
            acc, l_i, m_i = _attend_tile(
                acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, block_table_row, key_idx, key_ok, vis,
                kv_head, sm_scale_log2, block_size, head_dim,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_D, UPCAST_DOT, DOT_PRECISION)

        # ---- phase 2: the step's own keys, stored right after the prefix, under the step rule ----
        hi = T
        if is_causal:
            # Causal rows never see keys past the tile's last token: stop at the diagonal.
            hi = tl.minimum(T, t0 + TOKENS_PER_TILE)
        if NUM_SPLITS > 1:
            hi = tl.where(split == NUM_SPLITS - 1, hi, 0)  # the step keys belong to the last split
        for s0 in range(0, hi, BLOCK_N):
            s = s0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) step-relative key index
            key_ok = s < T
            if is_causal:
                vis = s[None, :] <= t[:, None]
            else:
                # Bit s % 32 of word s // 32 of the query's mask row (layout: kernels/__init__).
                word_ok = row_ok[:, None] & key_ok[None, :] & ((s // 32) < n_words)[None, :]
                words = tl.load(mask_ptr + row[:, None] * stride_mt + (s // 32)[None, :], mask=word_ok, other=0)
                vis = ((words >> (s % 32)[None, :]) & 1) != 0
            vis = vis & key_ok[None, :] & row_ok[:, None]
            if HAS_WINDOW:
                pos_k = tl.load(positions_ptr + q_start + s, mask=key_ok, other=0)
                vis = vis & ((pos_q[:, None] - pos_k[None, :]) < sliding_window)
            acc, l_i, m_i = _attend_tile(
                acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, block_table_row, C + s, key_ok, vis,
                kv_head, sm_scale_log2, block_size, head_dim,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_D, UPCAST_DOT, DOT_PRECISION)

    # A row that sees no key at all (only possible with an empty mask row and no prefix) gets 0.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if NUM_SPLITS == 1:
        o_off = row[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=io_ok)
    else:
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        p_off = split * stride_ps + row[:, None] * stride_pt + head[:, None] * stride_ph + offs_d[None, :]
        tl.store(o_part_ptr + p_off, out, mask=io_ok)
        tl.store(lse_part_ptr + split * stride_ls + row * stride_lt + head, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    o_part_ptr,  # (NUM_SPLITS, T_total, n_heads, head_dim) fp32
    lse_part_ptr,  # (NUM_SPLITS, T_total, n_heads) fp32, base 2
    out_ptr,  # (T_total, n_heads, head_dim)
    cu_seqlens_ptr,  # (B + 1,) int32
    B, head_dim,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt,
    stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # NUM_SPLITS padded to a power of two
    BLOCK_D: tl.constexpr,
):
    row, head = tl.program_id(0), tl.program_id(1)
    # Rows outside every sequence were never computed: leave them as they are.
    if (row < tl.load(cu_seqlens_ptr)) | (row >= tl.load(cu_seqlens_ptr + B)):
        return
    s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = s < NUM_SPLITS
    lse = tl.load(lse_part_ptr + s * stride_ls + row * stride_lt + head, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # (SPLITS_PAD,) weight of each split
    o = tl.load(o_part_ptr + s[:, None] * stride_ps + row * stride_pt + head * stride_ph + offs_d[None, :],
                mask=s_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)  # (SPLITS_PAD, BLOCK_D)
    denom = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < head_dim)


def step_order_ref(mask: torch.Tensor,  # (T_total, n_words) int32
                   cu_seqlens_q: torch.Tensor,  # (B + 1,) int32
                   causal: Optional[torch.Tensor] = None,  # (B,) bool: these sequences are skipped
                   ) -> tuple[torch.Tensor, torch.Tensor]:  # (T_total, n_words * 32) int32, (T_total,) int32
    """For every row of a masked sequence, the step keys it sees in step order: ``order[row, j]``
    is the step index of its j-th visible step key, ``counts[row]`` how many it sees (bits past
    its sequence's T are not keys). What the exact attention (``tree_attention(exact=True)``)
    reads to walk a tree row's keys as a chain's; entries past a count, and rows of causal
    sequences or of no sequence, are left 0 here and unspecified in ``step_order``."""
    T_total, n_words = mask.shape
    order = torch.zeros(T_total, n_words * 32, dtype=torch.int32, device=mask.device)
    counts = torch.zeros(T_total, dtype=torch.int32, device=mask.device)
    cu = cu_seqlens_q.tolist()
    flags = [False] * (len(cu) - 1) if causal is None else causal.tolist()
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        if flags[b] or e == s:
            continue
        vis = unpack_mask(mask[s:e], min(e - s, n_words * 32))  # (T, T) bool
        for i in range(e - s):
            idx = vis[i].nonzero().flatten()
            order[s + i, :idx.numel()] = idx.to(torch.int32)
            counts[s + i] = idx.numel()
    return order, counts


@triton.jit
def _step_order_kernel(
    mask_ptr,  # (T_total, n_words) int32
    cu_seqlens_ptr,  # (B + 1,) int32
    causal_ptr,  # (B,) int8; read only when HAS_CAUSAL
    order_ptr,  # (T_total, n_words * 32) int32
    count_ptr,  # (T_total,) int32
    n_words, stride_mt, stride_ot,
    HAS_CAUSAL: tl.constexpr,
    BLOCK: tl.constexpr,  # n_words * 32 padded to a power of two
):
    t, b = tl.program_id(0), tl.program_id(1)
    q_start = tl.load(cu_seqlens_ptr + b)
    T = tl.load(cu_seqlens_ptr + b + 1) - q_start
    if t >= T:
        return
    if HAS_CAUSAL:
        if tl.load(causal_ptr + b) != 0:
            return
    row = (q_start + t).to(tl.int64)
    s = tl.arange(0, BLOCK)
    ok = (s < T) & ((s // 32) < n_words)
    words = tl.load(mask_ptr + row * stride_mt + s // 32, mask=ok, other=0)
    bit = (((words >> (s % 32)) & 1) != 0) & ok
    rank = tl.cumsum(bit.to(tl.int32), 0) - 1
    tl.store(order_ptr + row * stride_ot + rank, s, mask=bit)
    tl.store(count_ptr + row, tl.sum(bit.to(tl.int32), 0))


def step_order(mask: torch.Tensor, cu_seqlens_q: torch.Tensor, max_seqlen_q: int,
               causal: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``step_order_ref`` (``max_seqlen_q`` >= the longest step sizes the grid
    without a host sync). Grid: (max_seqlen_q, B), one program per row."""
    T_total, n_words = mask.shape
    order = torch.empty(T_total, n_words * 32, dtype=torch.int32, device=mask.device)
    counts = torch.empty(T_total, dtype=torch.int32, device=mask.device)
    B = cu_seqlens_q.numel() - 1
    if B > 0 and max_seqlen_q > 0 and T_total > 0:
        _step_order_kernel[(max_seqlen_q, B)](
            mask, cu_seqlens_q, causal.view(torch.int8) if causal is not None else cu_seqlens_q, order, counts,
            n_words, mask.stride(0), order.stride(0),
            HAS_CAUSAL=causal is not None, BLOCK=triton.next_power_of_2(n_words * 32))
    return order, counts


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_int_tensor(name: str, x: torch.Tensor, dim: int, device: torch.device, dtypes=(torch.int32,)) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {x.dtype}")
    if x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but q is on {device}: all inputs must share a device")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _check_attention_args(q, k_cache, v_cache, cu_seqlens_q, positions, block_tables, context_lens,
                          mask, causal, sliding_window, max_seqlen_q, out) -> None:
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor (T_total, n_heads, head_dim), got {getattr(q, 'shape', q)}")
    if q.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q must be float32, float16 or bfloat16, got {q.dtype}")
    dev = q.device
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(c, torch.Tensor) or c.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (num_blocks, block_size, n_kv_heads, head_dim), "
                             f"got {getattr(c, 'shape', c)}")
        if c.dtype != q.dtype:
            raise ValueError(f"{name} dtype {c.dtype} must match q dtype {q.dtype}")
        if c.device != dev:
            raise ValueError(f"{name} is on {c.device} but q is on {dev}: all inputs must share a device")
        if c.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride(-1) == 1), got {c.stride()}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the same shape")
    T_total, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and of k_cache ({k_cache.shape[3]}) differ")
    if not 1 <= head_dim <= 256:
        raise ValueError(f"head_dim must be in [1, 256], got {head_dim}")
    if n_kv < 1 or n_heads % n_kv != 0:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv})")
    if n_heads // n_kv > MAX_GROUP:
        raise ValueError(f"n_heads / n_kv_heads must be <= {MAX_GROUP}, got {n_heads // n_kv}")
    if q.stride(-1) != 1:
        raise ValueError(f"q must be contiguous in head_dim (stride(-1) == 1), got {q.stride()}")
    _check_int_tensor("cu_seqlens_q", cu_seqlens_q, 1, dev)
    B = cu_seqlens_q.numel() - 1
    if B < 0:
        raise ValueError("cu_seqlens_q must hold B + 1 >= 1 offsets")
    _check_int_tensor("positions", positions, 1, dev)
    if positions.numel() != T_total:
        raise ValueError(f"positions must have T_total = {T_total} entries, got {positions.numel()}")
    _check_int_tensor("block_tables", block_tables, 2, dev)
    _check_int_tensor("context_lens", context_lens, 1, dev)
    if block_tables.shape[0] != B or context_lens.numel() != B:
        raise ValueError(f"block_tables rows ({block_tables.shape[0]}) and context_lens ({context_lens.numel()}) "
                         f"must equal B = len(cu_seqlens_q) - 1 = {B}")
    if mask is not None:
        _check_int_tensor("mask", mask, 2, dev)
        if mask.shape[0] != T_total:
            raise ValueError(f"mask must have T_total = {T_total} rows, got {mask.shape[0]}")
        if not 1 <= mask.shape[1] <= MAX_MASK_WORDS:
            raise ValueError(f"mask has {mask.shape[1]} words per row; supported: 1 .. {MAX_MASK_WORDS} "
                             f"(steps of at most {MAX_MASK_WORDS * 32} tokens under a mask)")
    if causal is not None:
        _check_int_tensor("causal", causal, 1, dev, dtypes=(torch.bool,))
        if causal.numel() != B:
            raise ValueError(f"causal must have B = {B} entries, got {causal.numel()}")
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(f"sliding_window must be None or an int >= 1, got {sliding_window!r}")
    if max_seqlen_q is not None and (not isinstance(max_seqlen_q, int) or max_seqlen_q < 0):
        raise ValueError(f"max_seqlen_q must be None or an int >= 0, got {max_seqlen_q!r}")
    if out is not None:
        if out.shape != q.shape or out.dtype != q.dtype or out.device != dev or out.stride(-1) != 1:
            raise ValueError(f"out must match q (shape {tuple(q.shape)}, {q.dtype}, {dev}, stride(-1) == 1), "
                             f"got {tuple(out.shape)} {out.dtype} {out.device}")


def _tile_config(max_seqlen_q: int, group: int, block_d: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): small M tiles for decode / short steps, big ones for prefill."""
    rows = max(16, triton.next_power_of_2(max(1, max_seqlen_q) * group))
    # 128-row tiles only where K/V tiles stay small (16-bit, head_dim <= 64): fp32 or wide heads
    # would need more shared memory than smaller GPUs have.
    block_m = min(rows, 128 if (block_d <= 64 and dtype != torch.float32) else 64)
    block_m = max(block_m, triton.next_power_of_2(group))  # a tile holds at least one token's heads
    # fp32 tiles take twice the registers / shared memory of 16-bit ones.
    block_n = 64 if (dtype != torch.float32 or block_d <= 64) else 32
    num_warps = 4 if block_m <= 64 else 8
    return block_m, block_n, num_warps


def _exact_tile_config(group: int, block_d: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """``_tile_config`` for ``exact``: one tile for every step, the smallest that holds a token's
    heads. A tile's shape decides how a GPU lays a row's reductions out over its threads (and
    which tensor-core instruction runs), so it must not follow the step's rows."""
    block_m = max(16, triton.next_power_of_2(group))
    block_n = 64 if (dtype != torch.float32 or block_d <= 64) else 32
    return block_m, block_n, 4 if block_m <= 64 else 8


def _choose_kv_splits(programs: int, max_keys: int, block_n: int, device: torch.device) -> int:
    """Flash-decoding split count: about two programs per SM, each split at least 4 key tiles.
    1 (no split) when the grid already covers the GPU (partials would cost more than they give) or
    under the interpreter (no parallel hardware to fill)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= sms:
        return 1
    return max(1, min(triton.cdiv(2 * sms, programs), max_keys // (4 * block_n), MAX_SPLITS))


def tree_attention(
    q: torch.Tensor,  # (T_total, n_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim)
    cu_seqlens_q: torch.Tensor,  # (B + 1,) int32
    positions: torch.Tensor,  # (T_total,) int32
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    context_lens: torch.Tensor,  # (B,) int32
    mask: Optional[torch.Tensor] = None,  # (T_total, n_words) int32 or None (= all causal)
    causal: Optional[torch.Tensor] = None,  # (B,) bool: True -> causal rule, mask rows ignored
    scale: Optional[float] = None,
    sliding_window: Optional[int] = None,
    max_seqlen_q: Optional[int] = None,  # >= the longest step; sizes the grid without a host sync
    out: Optional[torch.Tensor] = None,  # (T_total, n_heads, head_dim) to write into
    num_kv_splits: Optional[int] = None,  # prefix key ranges per sequence; None = by occupancy
    exact: bool = False,  # one reduction order per row whatever the step holds (below)
    key_order: Optional[tuple] = None,  # exact under a mask: ``step_order``'s tables (made once a step) or None
) -> torch.Tensor:  # (T_total, n_heads, head_dim), dtype of q
    """Triton version of ``tree_attention_ref`` (same arguments, same result).

    Grid: (step-token tiles, B, n_kv_heads * num_kv_splits). A program owns TOKENS_PER_TILE
    step tokens of one sequence times the GROUP query heads of one KV head, walks its range of
    prefix keys (only those in the sliding window), then -- in the last split -- the step keys
    (only up to the diagonal for causal steps). With several splits (decode on a small batch,
    where B * n_kv_heads programs would leave most of the GPU idle) each writes a partial
    output and its log-sum-exp, and ``_merge_splits_kernel`` combines them. A row that sees no
    key gives 0 (the reference gives NaN). Mask words past n_words read as 0.

    ``exact``: a row's result depends only on its query and the keys it sees, in their order,
    bit for bit, not on the step's other rows, its place in the batch, or where its keys lie in
    the cache. A tile's shape depends on neither ``max_seqlen_q`` nor occupancy, there are no
    splits, and every row walks its keys as one sequence in tiles of BLOCK_N by rank: the prefix
    by position, then its visible step keys in step order (under a mask, one step token per
    program, its keys gathered through ``step_order``). So a tree row whose ancestors are a
    chain's tokens gets the same bits as that chain's decoding step, where those keys are prefix.
    """
    _check_attention_args(q, k_cache, v_cache, cu_seqlens_q, positions, block_tables, context_lens,
                          mask, causal, sliding_window, max_seqlen_q, out)
    if checks.wanted(q):  # the values: on a GPU only under SPECDEC_CHECK_VALUES=1 (a host sync)
        cu = checks.offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0])
        checks.in_range("context_lens", context_lens, 0, 2**31 - 1, "committed tokens")
        bs = k_cache.shape[1]
        needed = [-(-(c + e - s) // bs) for c, s, e in zip(context_lens.tolist(), cu, cu[1:])]
        checks.block_tables("block_tables", block_tables, needed, k_cache.shape[0])
    if num_kv_splits is not None and (not isinstance(num_kv_splits, int) or not 1 <= num_kv_splits <= MAX_SPLITS):
        raise ValueError(f"num_kv_splits must be None or an int in [1, {MAX_SPLITS}], got {num_kv_splits!r}")
    if exact and num_kv_splits not in (None, 1):
        raise ValueError(f"exact=True walks each row's keys in one order: num_kv_splits must be None or 1, "
                         f"got {num_kv_splits!r}")
    if key_order is not None:
        words = mask.shape[1] if mask is not None else 0
        if not (isinstance(key_order, tuple) and len(key_order) == 2 and all(
                isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.device == q.device for t in key_order)
                and key_order[0].shape == (q.shape[0], 32 * words) and key_order[0].stride(-1) == 1
                and key_order[1].shape == (q.shape[0],)):
            raise ValueError(f"key_order must be step_order's (order, counts) for this step: int32 tensors on "
                             f"{q.device} of shapes ({q.shape[0]}, {32 * words}) and ({q.shape[0]},)")
    T_total, n_heads, head_dim = q.shape
    block_size, n_kv = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // n_kv
    B = cu_seqlens_q.numel() - 1
    out = torch.empty_like(q) if out is None else out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if B > 0 else 0  # host sync
    if B == 0 or max_seqlen_q == 0 or T_total == 0:
        return out
    scale = head_dim**-0.5 if scale is None else float(scale)
    block_d = max(16, triton.next_power_of_2(head_dim))
    if exact:
        block_m, block_n, num_warps = _exact_tile_config(group, block_d, q.dtype)
        # under a mask each row has its own keys by rank: one step token per program
        tokens_per_tile = block_m // group if mask is None else 1
    else:
        block_m, block_n, num_warps = _tile_config(max_seqlen_q, group, block_d, q.dtype)
        tokens_per_tile = block_m // group
    if mask is None:
        mask_mode, mask_arg, causal_arg = 0, cu_seqlens_q, cu_seqlens_q  # placeholders, never read
    elif causal is None:
        mask_mode, mask_arg, causal_arg = 1, mask, cu_seqlens_q
    else:
        mask_mode, mask_arg, causal_arg = 2, mask, causal.view(torch.int8)
    n_words = mask.shape[1] if mask is not None else 0
    stride_mt = mask.stride(0) if mask is not None else 0
    n_tiles = triton.cdiv(max_seqlen_q, tokens_per_tile)
    splits = 1 if exact else num_kv_splits if num_kv_splits is not None else _choose_kv_splits(
        n_tiles * B * n_kv, block_tables.shape[1] * block_size, block_n, q.device)
    if exact and mask is not None:
        order, counts = key_order if key_order is not None else step_order(mask, cu_seqlens_q, max_seqlen_q, causal)
    else:  # placeholders, never read
        order, counts = cu_seqlens_q.view(1, -1), cu_seqlens_q
    if splits > 1:
        o_part = torch.empty(splits, T_total, n_heads, head_dim, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(splits, T_total, n_heads, dtype=torch.float32, device=q.device)
    else:  # placeholders, never read or written
        o_part, lse_part = out, out
    grid = (n_tiles, B, n_kv * splits)
    _tree_attention_kernel[grid](
        q, k_cache, v_cache, out, o_part, lse_part,
        cu_seqlens_q, positions, block_tables, context_lens, mask_arg, causal_arg, order, counts,
        scale * 1.4426950408889634, sliding_window if sliding_window is not None else 0,
        block_size, n_words, head_dim,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        stride_mt,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1),
        order.stride(0),
        NUM_SPLITS=splits,
        GROUP=group, TOKENS_PER_TILE=tokens_per_tile,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        MASK_MODE=mask_mode, HAS_WINDOW=sliding_window is not None,
        # Off the GPU the interpreter runs the kernel; its bf16 dot is wrong (see _attend_tile).
        UPCAST_DOT=q.dtype == torch.bfloat16 and q.device.type != "cuda",
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        EXACT=exact,
        num_warps=num_warps, num_stages=2,
    )
    if splits > 1:
        _merge_splits_kernel[(T_total, n_heads)](
            o_part, lse_part, out, cu_seqlens_q, B, head_dim,
            o_part.stride(0), o_part.stride(1), o_part.stride(2),
            lse_part.stride(0), lse_part.stride(1),
            out.stride(0), out.stride(1),
            NUM_SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), BLOCK_D=block_d,
        )
    return out
