"""KV cache writes: ``kv_store`` (step K/V -> slots) and ``kv_compact`` (accepted K/V -> next
contiguous positions). Layout: see ``kernels/__init__``."""

import torch


def kv_store_ref(
    k_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, n_kv_heads, head_dim)
    k: torch.Tensor,  # (T_total, n_kv_heads, head_dim)
    v: torch.Tensor,  # (T_total, n_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # (T_total,) int64/int32; slot = block * block_size + offset, -1 = skip
) -> None:
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
