"""Attention of packed step queries over a paged KV cache under a per-step visibility mask.

One kernel serves prefill (causal), decode (T = 1), tree verification and the lookahead
window (bitmask), for a batch that mixes them. Layout: see ``kernels/__init__``.
"""

from typing import Optional

import torch

from kernels.mask import unpack_mask


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
        k = k_cache[blocks].reshape(n_blk * block_size, n_kv, head_dim)[:L]  # (L, n_kv, D)
        v = v_cache[blocks].reshape(n_blk * block_size, n_kv, head_dim)[:L]
        if is_causal[b]:
            step_vis = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        else:
            step_vis = unpack_mask(mask[s:e], T)
        vis = torch.cat([torch.ones(T, C, dtype=torch.bool, device=q.device), step_vis], dim=1)  # (T, L)
        if sliding_window is not None:
            q_pos = positions[s:e].long()
            k_pos = torch.cat([torch.arange(C, device=q.device), q_pos])
            vis &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
        qf = q[s:e].float().transpose(0, 1)  # (H, T, D)
        kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, D)
        vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        o = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=vis, scale=scale)
        out[s:e] = o.transpose(0, 1).to(q.dtype)
    return out
