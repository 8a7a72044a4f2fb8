"""Packing of per-step visibility masks into int32 bit words (layout: see kernels/__init__)."""

import sys

import torch

BITS = 32


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """(T, S) bool -> (T, ceil(S / 32)) int32; bit s % 32 of word s // 32 is mask[:, s]."""
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a 2-D bool tensor, got {tuple(mask.shape)} {mask.dtype}")
    T, S = mask.shape
    n_words = max(1, -(-S // BITS))
    padded = torch.zeros(T, n_words * BITS, dtype=torch.int64, device=mask.device)
    padded[:, :S] = mask.to(torch.int64)
    weights = torch.bitwise_left_shift(
        torch.ones(BITS, dtype=torch.int64, device=mask.device),
        torch.arange(BITS, dtype=torch.int64, device=mask.device),
    )
    words = (padded.view(T, n_words, BITS) * weights).sum(-1)  # (T, n_words) in [0, 2^32)
    words = words - ((words >> 31) & 1) * (1 << 32)  # two's complement into int32 range
    return words.to(torch.int32)


def tree_mask_words(parents: list[int], n_words: int) -> list[list[int]]:
    """``pack_mask`` of a tree's mask (row i sees its ancestors and itself; parents[i] < i,
    -1 for a root), as (T, n_words) int32 values in lists, without building the (T, T) mask:
    each row's ancestor set is one Python int."""
    if n_words * BITS < len(parents):
        raise ValueError(f"n_words must hold a bit per row: {len(parents)} rows need >= {-(-len(parents) // BITS)}, "
                         f"got {n_words}")
    rows, out = [], []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] must be -1 (a root) or an earlier row (0 <= p < {i}), got {p}")
        bits = (rows[p] if p >= 0 else 0) | (1 << i)
        rows.append(bits)
        words = [(bits >> (BITS * w)) & 0xFFFFFFFF for w in range(n_words)]
        out.append([v - (1 << 32) if v >= 1 << 31 else v for v in words])  # two's complement int32
    return out


def tree_mask_bytes(parents: list[int], n_words: int) -> bytes:
    """``tree_mask_words`` as the bytes of its (T, n_words) int32 values in the host's byte
    order: one ``to_bytes`` per row instead of a word at a time."""
    if n_words * BITS < len(parents):
        raise ValueError(f"n_words must hold a bit per row: {len(parents)} rows need >= {-(-len(parents) // BITS)}, "
                         f"got {n_words}")
    rows = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] must be -1 (a root) or an earlier row (0 <= p < {i}), got {p}")
        rows.append((rows[p] if p >= 0 else 0) | (1 << i))
    size = 4 * n_words
    return b"".join(bits.to_bytes(size, sys.byteorder) for bits in rows)


def unpack_mask(words: torch.Tensor, size: int) -> torch.Tensor:
    """(T, n_words) int32 -> (T, size) bool; inverse of ``pack_mask``."""
    if words.dim() != 2 or words.dtype != torch.int32:
        raise ValueError(f"mask words must be a 2-D int32 tensor, got {tuple(words.shape)} {words.dtype}")
    if size > words.shape[1] * BITS:
        raise ValueError(f"size={size} exceeds the {words.shape[1] * BITS} bits held by the mask words")
    idx = torch.arange(size, device=words.device)
    w = words[:, idx // BITS].to(torch.int64)
    return ((w >> (idx % BITS)) & 1).bool()
