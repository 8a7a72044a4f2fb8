"""Paged KV cache: one block pool per layer, block tables per sequence (layout: kernels/__init__).

Bookkeeping (which blocks a sequence owns, how many tokens it has committed) lives on the
host in plain lists; the pools live on the device. Every operation that can fail checks
first and changes nothing when it fails, so a rejected request never damages another
sequence's cache.
"""

from typing import Optional

import torch

from models.config import ModelConfig


class KVCacheFull(ValueError):
    """Not enough free blocks in the pool for the request (what was asked and what was left:
    the front doors say it in their own terms, decoding/inputs.py: cache_full)."""

    def __init__(self, needed: int, free: int, num_blocks: int, block_size: int):
        self.needed, self.free, self.num_blocks, self.block_size = needed, free, num_blocks, block_size
        super().__init__(f"KV cache pool exhausted: the step needs {needed} more blocks of {block_size} tokens, "
                         f"{free} of {num_blocks} are free (raise num_blocks / cache_tokens)")


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size, self.num_blocks = block_size, num_blocks
        shape = (cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, NB, BS, KV, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() takes the lowest
        self.blocks: dict[int, list[int]] = {}  # seq id -> physical blocks, in logical order
        self.lengths: dict[int, int] = {}  # seq id -> committed tokens
        # (k, v, their addresses and strides) for the compiled commit (models.packing.commit: made on
        # its first call and again if k or v is replaced; () in place of the addresses where it does
        # not take this cache)
        self.host_kv: Optional[tuple] = None

    # ---- sequences ---------------------------------------------------------------------
    def add(self, seq_id: int) -> None:
        if seq_id in self.blocks:
            raise ValueError(f"sequence {seq_id} is already in the cache")
        self.blocks[seq_id], self.lengths[seq_id] = [], 0

    def free(self, seq_id: int) -> None:
        self.check(seq_id)
        self.free_blocks.extend(reversed(self.blocks.pop(seq_id)))
        del self.lengths[seq_id]

    def check(self, seq_id: int) -> None:
        if seq_id not in self.blocks:
            raise KeyError(f"sequence {seq_id} is not in the cache")

    def capacity(self, seq_id: int) -> int:
        return len(self.blocks[seq_id]) * self.block_size

    def reserve(self, needs: dict[int, int]) -> None:
        """Make room for ``needs[seq] `` tokens past each sequence's committed length.
        All or nothing: raises KVCacheFull without touching anything if the pool is short."""
        extra = {}
        for s, n in needs.items():
            self.check(s)
            want = -(-(self.lengths[s] + n) // self.block_size)
            if want > len(self.blocks[s]):
                extra[s] = want - len(self.blocks[s])
        total = sum(extra.values())
        if total > len(self.free_blocks):
            raise KVCacheFull(total, len(self.free_blocks), self.num_blocks, self.block_size)
        for s, n in extra.items():
            self.blocks[s].extend(self.free_blocks.pop() for _ in range(n))

    def commit(self, seq_id: int, n: int) -> None:
        """Grow the committed length by n tokens whose K/V already sit at the next positions."""
        self.check(seq_id)
        if n < 0 or self.lengths[seq_id] + n > self.capacity(seq_id):
            raise ValueError(f"commit of {n} tokens exceeds the reserved capacity of sequence {seq_id}")
        self.lengths[seq_id] += n

    def truncate(self, seq_id: int, length: int) -> None:
        """Drop committed tokens past ``length`` and give back blocks no longer needed."""
        self.check(seq_id)
        if not 0 <= length <= self.lengths[seq_id]:
            raise ValueError(f"truncate length must be in [0, {self.lengths[seq_id]}], got {length}")
        self.lengths[seq_id] = length
        keep = -(-length // self.block_size)
        blocks = self.blocks[seq_id]
        self.free_blocks.extend(reversed(blocks[keep:]))
        del blocks[keep:]

    # ---- tensors for a step --------------------------------------------------------------
    def block_table(self, seq_ids: list[int], device=None) -> torch.Tensor:  # (B, max_blocks) int32
        width = max(1, max(len(self.blocks[s]) for s in seq_ids))
        rows = [self.blocks[s] + [-1] * (width - len(self.blocks[s])) for s in seq_ids]
        return torch.tensor(rows, dtype=torch.int32, device=device or self.k.device)

    def slots(self, seq_id: int, start: int, n: int) -> list[int]:
        """Physical slots of logical positions start .. start + n - 1 (must be reserved)."""
        bs, blocks = self.block_size, self.blocks[seq_id]
        return [blocks[j // bs] * bs + j % bs for j in range(start, start + n)]
