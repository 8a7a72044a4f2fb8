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
import threading
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
    lib.pack_step.argtypes = [i] + [p] * 15 + [i] * 7 + [p] * 5
    lib.pack_step.restype = None
    lib.pack_kv_move.argtypes = [p, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p, p, i]
    lib.pack_kv_move.restype = None


# the library, built on first use (enabled)
LIBRARY = cbuild.OnDemand("models-pack", SOURCES, FLAGS, [], _declare, "steps are packed by the Python reference")
# the glue of a staged CPU step and of a CUDA graph's padded inputs in one call each (models/cpu/packext.c: pack.c
# and a CPython extension), built on first use where this Python's headers are installed; else the Python glue
# below calls the library
EXT = cbuild.OnDemandModule("_packext", [SOURCES[0], SOURCES[0].with_name("packext.c")],
                            "a step's packing is glued in Python (ctypes)")


def enabled() -> bool:
    """The compiled packing is switched on and built."""
    return cbuild.host_compiled() and LIBRARY.get() is not None


def _ext() -> bool:
    """Whether ``pack`` glues a staged step in the extension (switched on with the compiled path)."""
    return cbuild.host_glue() and EXT.get() is not None


def _ptr(a: array) -> int:
    return a.buffer_info()[0]


def _aligned(sizes: list[int], align: int) -> tuple[list[int], int]:
    """Each piece's start, every one a multiple of ``align``, and the total."""
    starts, n = [], 0
    for s in sizes:
        starts.append(n)
        n += -(-s // align) * align
    return starts, n


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def table_width(blocks: int) -> int:
    """A step's block-table width for a widest sequence of ``blocks`` blocks: rounded up to a
    power of two (the entries past a sequence's blocks are -1), so that the staging's kept layout
    of a step does not change every time a sequence takes a new block."""
    return _pow2(max(1, blocks))


# step layouts whose tensors a ``Staging`` keeps (batches shrink as sequences finish, trees vary
# in size: a few dozen layouts per generate call)
MAX_REUSED = 256


class Staging:
    """The host buffers steps are packed into (``pack``'s ``staging``, host devices): one int32
    and one int64 array laid out for the largest step met so far, each piece's room rounded up
    to a power of two. Every step writes the same memory, a piece's tensor view is made once per
    size, and a step's whole (tokens, meta, logits rows) once per layout. A tree's step varies in
    size from step to step: made anew, its views were most of the packing (about 15 of a tree
    step's 36 us, against 16 us when they are kept). One serves every runner of a thread
    (``thread_staging``): a generate call's runner lives for a few dozen steps, too few to meet
    its layouts again. The caller must be done with a step's tensors before the thread packs
    its next step."""

    def __init__(self):
        self.caps = (0, 0, 0, 0, 0)  # batch, rows, table entries, mask words, logits rows
        self.steps: dict = {}  # layout -> (tokens, meta, logits rows)
        self._views: dict = {}  # (piece, size) -> tensor

    def fit(self, B: int, n: int, table: int, mask: int, R: int) -> None:
        """Room for a step of these sizes (its buffers and views made anew if it is larger)."""
        caps = self.caps
        if B <= caps[0] and n <= caps[1] and table <= caps[2] and mask <= caps[3] and R <= caps[4]:
            return
        caps = self.caps = tuple(max(c, _pow2(x)) for c, x in zip(caps, (B, n, table, mask, R)))
        s32, n32 = _aligned([caps[0] + 1, caps[1], caps[0], caps[2], caps[3]], 4)
        s64, n64 = _aligned([caps[1], caps[1], caps[4]], 2)
        # a resized array would move under its views: new ones replace them (earlier steps' tensors
        # keep the old ones alive)
        self.i32, self.i64 = array("i", bytes(4 * n32)), array("q", bytes(8 * n64))
        self.at32, self.at64 = array("q", s32), array("q", s64)
        self.v32 = torch.frombuffer(self.i32, dtype=torch.int32)
        self.v64 = torch.frombuffer(self.i64, dtype=torch.int64)
        self.steps.clear()
        self._views.clear()

    def _view(self, piece: int, wide: bool, size: int, shape: Optional[tuple] = None) -> torch.Tensor:
        key = (piece, wide, size, shape)
        v = self._views.get(key)
        if v is None:
            start = (self.at64 if wide else self.at32)[piece]
            v = (self.v64 if wide else self.v32)[start:start + size]
            self._views[key] = v = v if shape is None else v.view(shape)
        return v

    def layout(self, key: tuple, device="cpu") -> tuple:
        """The kept (tokens, meta, logits rows) of the layout ``key`` = (B, rows, table width,
        mask words, logits rows or -1 for every row, the sequences' tree flags where there are
        mask words), made (and the buffers grown) where it is new."""
        packed = self.steps.get(key)
        if packed is None:
            B, n, width, n_words, R, trees = key
            self.fit(B, n, B * width, n * n_words, max(R, 0))
            if len(self.steps) >= MAX_REUSED:
                self.steps.clear()
            packed = self.steps[key] = self.step(B, n, width, n_words, R, list(trees), device)
        return packed

    def step(self, B: int, n: int, width: int, n_words: int, R: int, trees: list[bool], device) -> tuple:
        """The (tokens, meta, logits rows or None) views of a step of this layout (``R`` < 0:
        every row), after ``fit``."""
        v = self._view
        causal = None
        if n_words:
            key = ("causal", tuple(trees))
            causal = self._views.get(key)
            if causal is None:
                causal = self._views[key] = torch.tensor([not t for t in trees], dtype=torch.bool, device=device)
        meta = StepMeta(cu_seqlens_q=v(0, False, B + 1), positions=v(1, False, n), context_lens=v(2, False, B),
                        block_tables=v(3, False, B * width, (B, width)), slot_mapping=v(1, True, n), max_seqlen_q=0,
                        mask=v(4, False, n * n_words, (n, n_words)) if n_words else None, causal=causal)
        return v(0, True, n), meta, v(2, True, R) if R >= 0 else None


_local = threading.local()


def thread_staging() -> Staging:
    """This thread's ``Staging``: runners' steps in one thread run one after another, steps in
    two threads may overlap."""
    staging = getattr(_local, "staging", None)
    if staging is None:
        staging = _local.staging = Staging()
    return staging


def staged(cache, inputs: list, vocab: int, max_context: int) -> Optional[tuple]:
    """A runner's own CPU step (``ModelRunner.prepare(reuse=True)`` on a host device) packed into
    this thread's staging in one call of the extension, its checks (every sequence in the cache,
    none twice, ``pack_check``) and the cache room included; None, with nothing changed, where it
    does not take the step (a switch off, the extension not built yet, anything it refuses): the
    runner's full ``prepare`` then runs and says what is wrong. *Why a path of its own*: after a
    forward each Python call on the way costs its lines from memory, and ``prepare`` -> ``pack``
    had been about ten of them for one C call (the cold step's prepare 61-74 -> 34-44 us:
    bench/results/2026-11-28-cpu-host-split/NOTES.md)."""
    ext = EXT.module
    if ext is None or not (cbuild._host["compiled"] and cbuild._glue["on"]):
        return None
    staging = getattr(_local, "staging", None)
    if staging is None:
        staging = thread_staging()
    return ext.pack_staged(inputs, cache.lengths, cache.blocks, cache.free_blocks, cache.block_size, vocab,
                           max_context, staging)


def _gather(cache, inputs: list) -> Optional[tuple]:
    """``inputs`` as the flat arrays ``pack_check`` / ``pack_step`` read: (their pointers, T,
    total rows, logits rows per input); None for a step the reference must take (an explicit
    mask, not integers, lists of the wrong length)."""
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
    # the arrays ride along: the pointers are theirs
    return args, T, n, n_rows, has_p, (T, off, ctx, tokens, depths, parents, has_d, has_p, n_rows, rows_off, rows,
                                       all_rows)


def _checked_blocks(cache, inputs: list, gathered: tuple, vocab: int, max_context: int) -> Optional[tuple]:
    """The C checks of a gathered step, then its cache room reserved (all or nothing) and its
    blocks as flat arrays (blocks, block_off, n_blocks); None, with nothing reserved, where the
    checks refuse it."""
    args, T = gathered[0], gathered[1]
    if LIBRARY.lib.pack_check(len(inputs), *args, vocab, max_context) != 0:
        return None
    cache.reserve({inp.seq_id: t for inp, t in zip(inputs, T)})  # all or nothing
    blocks, block_off, n_blocks = array("i"), array("i"), array("i")
    for inp in inputs:
        own = cache.blocks[inp.seq_id]
        block_off.append(len(blocks))
        n_blocks.append(len(own))
        blocks.extend(own)
    return blocks, block_off, n_blocks


def pack(cache, inputs: list, vocab: int, max_context: int, device, staging: Optional[Staging] = None
         ) -> Optional[tuple[torch.Tensor, StepMeta, Optional[torch.Tensor]]]:
    """``ModelRunner.prepare``'s result for ``inputs`` (each sequence in ``cache``, none twice:
    the caller checked), the cache room reserved. ``staging`` (a ``Staging`` the caller keeps;
    host devices only): the step is written into its buffers and returned as its kept views, so
    a step makes no tensors; the caller must be done with the earlier step's tensors. None, with
    nothing reserved, for a step the reference must take (an explicit mask, or an input the
    checks refuse)."""
    lib = LIBRARY.lib
    B = len(inputs)
    if B == 0:
        return None
    staged = staging is not None and torch.device(device).type == "cpu"
    if staged and type(inputs) is list and _ext():
        packed = EXT.module.pack_staged(inputs, cache.lengths, cache.blocks, cache.free_blocks, cache.block_size,
                                        vocab, max_context, staging)
        if packed is not None:
            return packed
    gathered = _gather(cache, inputs)
    if gathered is None:
        return None
    room = _checked_blocks(cache, inputs, gathered, vocab, max_context)
    if room is None:
        return None
    args, T, n, n_rows, has_p = gathered[:5]
    blocks, block_off, n_blocks = room
    width = table_width(max(n_blocks))
    trees = [bool(p) for p in has_p]
    n_words = -(-max(t for t, tree in zip(T, trees) if tree) // 32) if any(trees) else 0
    R = sum(n_rows)
    with_idx = R != n
    tail = (_ptr(blocks), _ptr(block_off), _ptr(n_blocks), cache.block_size, width, n_words, int(with_idx), n, B,
            R if with_idx else 0)
    if staged:
        packed = staging.layout((B, n, width, n_words, R if with_idx else -1, tuple(trees) if n_words else ()),
                                device)
        lib.pack_step(B, *args, *tail, _ptr(staging.at32), _ptr(staging.at64), _ptr(staging.i32),
                      _ptr(staging.i64), None)
        packed[1].max_seqlen_q = max(T)
        return packed
    s32, n32 = _aligned([B + 1, n, B, B * width, n * n_words], 4)
    s64, n64 = _aligned([n, n, R if with_idx else 0], 2)
    i32, i64 = array("i", bytes(4 * n32)), array("q", bytes(8 * n64))
    at32, at64 = array("q", s32), array("q", s64)
    lib.pack_step(B, *args, *tail, _ptr(at32), _ptr(at64), _ptr(i32), _ptr(i64), None)
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
    return v64[s64[0]:s64[0] + n], meta, v64[s64[2]:s64[2] + R] if with_idx else None


def pack_padded(cache, inputs: list, vocab: int, max_context: int, dims: tuple, at32: array, at64: array,
                i32: int, i64: int, causal: Optional[int]) -> Optional[tuple[int, int]]:
    """``inputs`` written into a CUDA graph's static inputs on the host (models/graphs.py):
    ``dims`` = (rows, batch, width, mask words, logits rows) of its padded shape, ``at32`` /
    ``at64`` the pieces' offsets from the addresses ``i32`` / ``i64``, ``causal`` the address
    of its per-sequence flags (or None), padding as ``pack_step`` says. The cache room is
    reserved. Returns (rows, logits rows) of the step; None, with nothing reserved, where the
    reference must take it (as ``pack``) or where a sequence holds more blocks than the width."""
    if type(inputs) is list and _ext():
        got = EXT.module.pack_padded(inputs, cache.lengths, cache.blocks, cache.free_blocks, cache.block_size, vocab,
                                     max_context, dims, at32, at64, i32, i64, causal)
        if got is not None:
            return got
    rows_pad, batch_pad, width, words, r_pad = dims
    B = len(inputs)
    gathered = _gather(cache, inputs)
    if gathered is None or B > batch_pad:
        return None
    args, T, n, n_rows = gathered[:4]
    R = sum(n_rows)
    if n > rows_pad or R > r_pad or (words and -(-max(T) // 32) > words) or (any(gathered[4]) and not words):
        return None
    bs = cache.block_size
    if any(max(len(cache.blocks[inp.seq_id]), -(-(cache.lengths[inp.seq_id] + t) // bs)) > width
           for inp, t in zip(inputs, T)):
        return None
    room = _checked_blocks(cache, inputs, gathered, vocab, max_context)
    if room is None:
        return None
    blocks, block_off, n_blocks = room
    LIBRARY.lib.pack_step(B, *args, _ptr(blocks), _ptr(block_off), _ptr(n_blocks), cache.block_size, width, words,
                          1, rows_pad, batch_pad, r_pad, _ptr(at32), _ptr(at64), i32, i64, causal)
    return n, R


def compacts(cache) -> bool:
    """Whether ``compact`` moves this cache's rows: the compiled path is on and the cache is
    contiguous host memory (a device's cache is compacted by its backend's kernel)."""
    return enabled() and cache.k.device.type == "cpu" and cache.k.is_contiguous() and cache.v.is_contiguous()


def _kv_rows(k) -> tuple[int, int, int]:
    """(layers, bytes a layer, bytes a slot's row) of a contiguous (L, blocks, block size, kv heads,
    head dim) K or V pool: what ``pack_kv_move`` steps by."""
    L, NB, BS, KV, D = k.shape
    row = KV * D * k.element_size()
    return L, NB * BS * row, row


def commit(cache, accepted: dict) -> bool:
    """``ModelRunner.commit`` of ``accepted`` (sequence -> its accepted step rows) in one call of
    the extension (packext.c ``commit_host``: the checks, the moving rows' K/V and the committed
    lengths), for a cache ``compacts`` takes, with the compiled path and its glue switched on.
    True when it was done; False, with nothing changed, for all it does not take (a device's
    cache, a path switched off, a value the checks refuse): the caller's Python then commits, or
    raises naming what is wrong."""
    ext = EXT.module  # the switches read in place, as in staged
    if ext is None or not (cbuild._host["compiled"] and cbuild._glue["on"]):
        if not (cbuild.host_compiled() and _ext()):
            return False
        ext = EXT.module
    k, v, held = cache.k, cache.v, cache.host_kv
    if held is None or held[0] is not k or held[1] is not v:  # the K/V's addresses and strides, once per pair
        args = ()
        if k.device.type == "cpu" and k.is_contiguous() and v.is_contiguous():
            args = (k.data_ptr(), v.data_ptr(), *_kv_rows(k))
        held = cache.host_kv = (k, v, args)
    return bool(held[2]) and ext.commit_host(accepted, cache.lengths, cache.blocks, cache.block_size,
                                             *held[2]) is True


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
        LIBRARY.lib.pack_kv_move(k.data_ptr(), cache.v.data_ptr(), *_kv_rows(k), _ptr(src), _ptr(dst), len(src))
