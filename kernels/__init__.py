"""Kernels: each file holds a Triton kernel, its launcher and a pure-torch ``*_ref``.

Layout (documented here, once; every kernel and the model follow it)
---------------------------------------------------------------------
Packed step ("varlen") -- one forward serves B sequences at once:
    tokens        [T_total]            step tokens of all sequences, back to back
    positions     [T_total]   int32    RoPE position of each step token
    cu_seqlens_q  [B + 1]     int32    sequence b owns rows cu[b] : cu[b+1]  (T_b = cu[b+1] - cu[b])

Paged KV cache -- one pool per layer (the model stacks layers in a leading dim):
    k_cache, v_cache  [num_blocks, block_size, n_kv_heads, head_dim]
    block_tables      [B, max_blocks]  int32   physical block of each logical block, -1 = none
    context_lens      [B]              int32   committed tokens of each sequence (its prefix)
    Logical position j of sequence b lives in block block_tables[b, j // block_size],
    offset j % block_size; its "slot" is block * block_size + offset.

A step's own K/V are written (``kv_store``) to the slots right after the prefix, logical
positions context_lens[b] + t for t < T_b, *before* attention runs, so attention reads
prefix and step keys from the cache the same way. After verification ``kv_compact`` moves
the K/V of the accepted step tokens to the next contiguous positions; the caller then grows
context_lens. Everything past the committed prefix is scratch, overwritten next step.

Visibility of step query i (of sequence b) over keys:
    * every prefix key j < context_lens[b] is visible;
    * step key t is visible iff (causal[b] and t <= i) or bit t of mask row i is set;
      mask  [T_total, n_words] int32: row of packed query token, bit t % 32 of word t // 32;
    * with a sliding window w (Mistral): additionally positions[q] - pos(key) < w, where a
      prefix key's position is its index j and a step key's is positions[cu[b] + t].
"""

from kernels.backend import Backend, TorchBackend, TritonBackend, get_backend
from kernels.mask import pack_mask, unpack_mask

__all__ = ["Backend", "TorchBackend", "TritonBackend", "get_backend", "pack_mask", "unpack_mask"]
