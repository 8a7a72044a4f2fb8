"""The compiled twin of a step's packing (``ModelRunner.prepare``; ``models/cpu/pack.c``).

The input checks, positions, cache slots, row offsets, block table, tree mask words and
logits rows of a step computed in one C call into the two flat buffers that go to the device
(one copy per dtype). ``ModelRunner._prepare_ref`` is the reference: tests/test_kv_cache.py
holds the two equal field by field. A step with an explicit (T, T) mask, or an input the C
checks refuse, takes the reference, which then names what is wrong.

Built on first use like the CPU kernels (``kernels/cbuild.py``, portable flags). Where it
cannot build, the reference runs and one warning says why. The switch is the host path's:
``decoding.compiled.use_compiled`` / ``SPECDEC_HOST=ref`` (``kernels.cbuild.host_compiled``).
"""

import ctypes
from array import array
from pathlib import Path
from typing import Optional

import torch

from kernels import cbuild
from kernels.backend import StepMeta

SOURCES = [Path(__file__).with_name("cpu") / "pack.c"]
FLAGS = ["-O2", "-std=c11", "-shared", "-fPIC"]

def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.pack_check.argtypes = [i] + [p] * 12 + [ctypes.c_int64] * 2
    lib.pack_check.restype = i
    lib.pack_step.argtypes = [i] + [p] * 15 + [i] * 4 + [p] * 4
    lib.pack_step.restype = None
    lib.pack_kv_move.argtypes = [p, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p, p, i]
    lib.pack_kv_move.restype = None


# the library, built on first use (enabled)
LIBRARY = cbuild.OnDemand("models-pack", SOURCES, FLAGS, [], _declare, "steps are packed by the Python reference")


def enabled() -> bool:
    """The compiled packing is switched on and built."""
    return cbuild.host_compiled() and LIBRARY.get() is not None


def _ptr(a: array) -> int:
    return a.buffer_info()[0]


def _aligned(sizes: list[int], align: int) -> tuple[list[int], int]:
    """Each piece's start, every one a multiple of ``align``, and the total."""
    starts, n = [], 0
    for s in sizes:
        starts.append(n)
        n += -(-s // align) * align
    return starts, n


# layouts whose host buffers and tensor views a runner keeps for its next steps (``pack``'s reuse)
MAX_REUSED = 64


def pack(cache, inputs: list, vocab: int, max_context: int, device, reuse: Optional[dict] = None
         ) -> Optional[tuple[torch.Tensor, StepMeta, Optional[torch.Tensor]]]:
    """``ModelRunner.prepare``'s result for ``inputs`` (each sequence in ``cache``, none twice:
    the caller checked), the cache room reserved. ``reuse`` (a dict the caller keeps; host
    devices only): the buffers and tensors of an earlier step of the same layout are written
    again and returned, so a step costs no tensor views (most of a small step's packing); the
    caller must be done with that earlier step's tensors. None, with nothing reserved, for a step the
    reference must take (an explicit mask, or an input the checks refuse)."""
    lib = LIBRARY.lib
    B = len(inputs)
    if B == 0:
        return None
    T, off, ctx = array("i"), array("i"), array("q")
    tokens, depths, parents, has_d, has_p = array("q"), array("i"), array("i"), array("B"), array("B")
    n_rows, rows_off, rows, all_rows = array("i"), array("i"), array("i"), array("B")
    lengths = cache.lengths
    n = 0
    try:
        for inp in inputs:
            if inp.mask is not None:
                return None
            t = len(inp.tokens)
            T.append(t)
            off.append(n)
            ctx.append(lengths[inp.seq_id])
            tokens.extend(inp.tokens)
            if inp.depths is None:
                depths.extend(range(t))
            elif len(inp.depths) == t:
                depths.extend(inp.depths)
            else:
                return None
            has_d.append(1)
            if inp.parents is None:
                parents.frombytes(bytes(4 * t))
                has_p.append(0)
            elif len(inp.parents) == t:
                parents.extend(inp.parents)
                has_p.append(1)
            else:
                return None
            rows_off.append(len(rows))
            if inp.logits_rows is None:
                n_rows.append(t)
                all_rows.append(1)
            else:
                rows.extend(inp.logits_rows)
                n_rows.append(len(inp.logits_rows))
                all_rows.append(0)
            n += t
    except (TypeError, OverflowError):  # not integers: the reference says what is wrong
        return None
    args = (_ptr(T), _ptr(off), _ptr(tokens), _ptr(depths), _ptr(parents), _ptr(has_d), _ptr(has_p), _ptr(ctx),
            _ptr(n_rows), _ptr(rows_off), _ptr(rows) if rows else None, _ptr(all_rows))
    if lib.pack_check(B, *args, vocab, max_context) != 0:
        return None
    cache.reserve({inp.seq_id: t for inp, t in zip(inputs, T)})  # all or nothing
    blocks, block_off, n_blocks = array("i"), array("i"), array("i")
    for inp in inputs:
        own = cache.blocks[inp.seq_id]
        block_off.append(len(blocks))
        n_blocks.append(len(own))
        blocks.extend(own)
    width = max(1, max(n_blocks))
    trees = [bool(p) for p in has_p]
    n_words = -(-max(t for t, tree in zip(T, trees) if tree) // 32) if any(trees) else 0
    R = sum(n_rows)
    with_idx = R != n
    key = None
    if reuse is not None and torch.device(device).type == "cpu":
        key = (B, n, width, n_words, R if with_idx else -1, tuple(trees) if n_words else ())
        kept = reuse.get(key)
        if kept is not None:  # the same layout: the same offsets, views and padding (zero where unused)
            i32, i64, at32, at64, packed = kept
            lib.pack_step(B, *args, _ptr(blocks), _ptr(block_off), _ptr(n_blocks), cache.block_size, width, n_words,
                          int(with_idx), _ptr(at32), _ptr(at64), _ptr(i32), _ptr(i64))
            packed[1].max_seqlen_q = max(T)
            return packed
    s32, n32 = _aligned([B + 1, n, B, B * width, n * n_words], 4)
    s64, n64 = _aligned([n, n, R if with_idx else 0], 2)
    i32, i64 = array("i", bytes(4 * n32)), array("q", bytes(8 * n64))
    at32, at64 = array("q", s32), array("q", s64)
    lib.pack_step(B, *args, _ptr(blocks), _ptr(block_off), _ptr(n_blocks), cache.block_size, width, n_words,
                  int(with_idx), _ptr(at32), _ptr(at64), _ptr(i32), _ptr(i64))
    # the tensors share the arrays' memory and hold references to them (on the CPU, .to is a no-op)
    v32 = torch.frombuffer(i32, dtype=torch.int32).to(device)
    v64 = torch.frombuffer(i64, dtype=torch.int64).to(device)
    meta = StepMeta(
        cu_seqlens_q=v32[s32[0]:s32[0] + B + 1],
        positions=v32[s32[1]:s32[1] + n],
        block_tables=v32[s32[3]:s32[3] + B * width].view(B, width),
        context_lens=v32[s32[2]:s32[2] + B],
        slot_mapping=v64[s64[1]:s64[1] + n],
        max_seqlen_q=max(T),
        mask=v32[s32[4]:s32[4] + n * n_words].view(n, n_words) if n_words else None,
        causal=torch.tensor([not t for t in trees], dtype=torch.bool, device=device) if n_words else None,
    )
    packed = v64[s64[0]:s64[0] + n], meta, v64[s64[2]:s64[2] + R] if with_idx else None
    if key is not None:
        if len(reuse) >= MAX_REUSED:
            reuse.clear()
        reuse[key] = (i32, i64, at32, at64, packed)
    return packed


def compacts(cache) -> bool:
    """Whether ``compact`` moves this cache's rows: the compiled path is on and the cache is
    contiguous host memory (a device's cache is compacted by its backend's kernel)."""
    return enabled() and cache.k.device.type == "cpu" and cache.k.is_contiguous() and cache.v.is_contiguous()


def compact(cache, moving: dict[int, list[int]]) -> None:
    """``kv_compact_ref`` of the sequences in ``moving`` (sequence -> its accepted step rows,
    increasing) in a cache ``compacts`` takes: each accepted row's K/V moved to the next
    contiguous position, every layer, in one call (the reference: a torch copy per row)."""
    bs, src, dst = cache.block_size, array("q"), array("q")
    for s, rows in moving.items():
        ctx, blocks = cache.lengths[s], cache.blocks[s]
        for i, r in enumerate(rows):
            if r != i:
                a, b = ctx + r, ctx + i
                src.append(blocks[a // bs] * bs + a % bs)
                dst.append(blocks[b // bs] * bs + b % bs)
    if src:
        k = cache.k
        L, row = k.shape[0], k[0, 0, 0].numel() * k.element_size()
        LIBRARY.lib.pack_kv_move(k.data_ptr(), cache.v.data_ptr(), L, k[0].numel() * k.element_size(), row,
                                 _ptr(src), _ptr(dst), len(src))
