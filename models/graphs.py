"""Decoding steps replayed from CUDA graphs.

On a GPU an eager forward of a small model is all host work: about 25 small ops per layer,
each 15-40 us to issue, while the GPU computes the whole step in about 2 ms (SmolLM2-135M on
an H100; docs/DESIGN.md, "The GPU path"). A CUDA graph records one forward's launches once and replays
them with a single call. A graph's shapes and pointers are fixed, so each step is padded to a
bucketed shape and copied into that shape's static input tensors:

  * step rows to the next power of two; the padded rows belong to no sequence (they lie past
    ``cu_seqlens_q[-1]``), write no K/V (slot -1), attend to nothing and are never returned;
    a row's result does not depend on the other rows of a product, so they change nothing;
  * the batch to the next power of two with empty sequences (no tokens, no context);
  * block-table columns to one width for all steps, the most blocks a sequence can hold rounded up
    to a power of two (-1 past a sequence's blocks; attention reads only up to each context
    length, so the columns cost a copy, not work);
  * ``max_seqlen_q`` to the next power of two (the kernel only needs an upper bound);
  * the mask words to those of the padded rows, the logits rows to the padded rows (row 0
    repeated; a product's rows cost little next to another graph).

So a step's shape depends on its rows, its batch and whether it carries a tree mask, not on
how far decoding has come: a decode does not meet a new shape (and pay for a capture) each
time its context crosses a block boundary, and ``warm_up`` can capture every shape of
batch-1 decoding ahead of time (18 graphs), as serving engines do at start-up.

The key of a graph is that padded shape; graphs are captured on first use or by ``warm_up``
(the step runs once eagerly first: Triton compiles outside the capture) and kept, least
recently used first out, up to ``max_graphs``, all in one memory pool. Steps larger than
``max_tokens`` rows or ``max_batch`` sequences (prefill chunks) run eagerly. A graph also
fixes the cache's address, so one ``StepGraphs`` serves one ``PagedKVCache``:
``use_cuda_graphs`` makes ``ModelRunner.for_batch`` keep one runner per model and reuse it
while it is free and large enough, so that every ``generate`` call does not capture its
graphs again.

Only the Triton backend is captured (the torch backend plans each step on the host).
``capture=False`` runs the same padded step eagerly: that is how the padding is tested without
a GPU (tests/test_graphs.py).
"""

import time
import warnings
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch

from kernels.backend import StepMeta
from models import packing


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class StepShape:
    """A step's padded shape: what one graph is captured for."""

    rows: int  # step rows (tokens of every sequence)
    batch: int  # sequences
    width: int  # block-table columns
    max_q: int  # max_seqlen_q handed to attention
    words: int  # mask words per row, 0 = no mask
    causal: bool  # per-sequence causal flags given (with a mask)
    logits: int  # logits rows


class _Graph:
    """One shape's static inputs, and its graph and static output once captured.

    The static inputs are views of one device buffer (``dev``) laid out as ``host``, the host
    buffer a step is packed into (pinned on a GPU): a step's inputs go in one copy
    (``StepGraphs.stage``) instead of a copy or fill per piece."""

    def __init__(self, shape: StepShape, device: torch.device):
        s, dev = shape, torch.device(device)
        self.shape = shape
        # byte offsets, each piece 16-byte aligned (as a tensor of its own: Triton specialises on
        # alignment): int64 tokens | slots | logits rows, int32 cu | positions | lengths | table |
        # mask, then the causal flags
        sizes = [(s.rows, 8), (s.rows, 8), (s.logits, 8), (s.batch + 1, 4), (s.rows, 4), (s.batch, 4),
                 (s.batch * s.width, 4), (s.rows * s.words, 4)]
        offs, n = [], 0
        for size, item in sizes:
            offs.append(n)
            n += -(-size * item // 16) * 16
        self.base32 = offs[3]  # where pack_step's int32 pieces start (its offsets are elements from there)
        self.at64 = array("q", [o // 8 for o in offs[:3]])
        self.at32 = array("q", [(o - self.base32) // 4 for o in offs[3:]])
        self.causal_at = n
        self.nbytes = n + s.batch
        self.dev = torch.zeros(self.nbytes, dtype=torch.uint8, device=dev)
        self.host = self.dev if dev.type == "cpu" else torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=True)
        self.copied: Optional["torch.cuda.Event"] = None  # the host buffer's last copy to the device

        def piece(at: int, size: int, dtype, item: int) -> torch.Tensor:
            return self.dev[at:at + item * size].view(dtype)

        self.tokens = piece(offs[0], s.rows, torch.int64, 8)
        self.meta = StepMeta(
            cu_seqlens_q=piece(offs[3], s.batch + 1, torch.int32, 4),
            positions=piece(offs[4], s.rows, torch.int32, 4),
            block_tables=piece(offs[6], s.batch * s.width, torch.int32, 4).view(s.batch, s.width),
            context_lens=piece(offs[5], s.batch, torch.int32, 4),
            slot_mapping=piece(offs[1], s.rows, torch.int64, 8),
            max_seqlen_q=s.max_q,
            mask=piece(offs[7], s.rows * s.words, torch.int32, 4).view(s.rows, s.words) if s.words else None,
            causal=self.dev[n:n + s.batch].view(torch.bool) if s.causal else None,
        )
        self.idx = piece(offs[2], s.logits, torch.int64, 8)
        # an empty step (what warm_up captures): no sequence owns a row
        self.meta.block_tables.fill_(-1)
        self.meta.slot_mapping.fill_(-1)
        if self.meta.causal is not None:
            self.meta.causal.fill_(True)
        if self.host is not self.dev:
            self.host.copy_(self.dev)
        self.graph: Optional["torch.cuda.CUDAGraph"] = None
        self.out: Optional[torch.Tensor] = None


class StepGraphs:
    """Runs ``model(tokens, meta, cache.k, cache.v, logits_idx)`` from CUDA graphs.

    ``run`` returns the logits (R, vocab) of a step, or None when the step is too large for a
    graph (the caller runs it eagerly). ``stats``: captures, replays, eager fallbacks and the
    seconds spent capturing (``capture_s``, the eager run before each capture included)."""

    DEFAULT_MAX_TOKENS = 256

    def __init__(self, model, cache, *, max_tokens: int = DEFAULT_MAX_TOKENS, max_batch: int = 64,
                 max_graphs: int = 128, capture: Optional[bool] = None):
        if model.backend.name != "triton":
            raise ValueError(f"cuda graphs need the triton kernel backend (the {model.backend.name!r} backend "
                             "works out each step on the host); use --kernel triton")
        device = cache.k.device
        capture = device.type == "cuda" if capture is None else capture
        if capture and device.type != "cuda":
            raise ValueError(f"cuda graphs need a CUDA device, the cache is on {device}")
        for name, v, lo in (("max_tokens", max_tokens, 1), ("max_batch", max_batch, 1), ("max_graphs", max_graphs, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        self.model, self.cache, self.device, self.capture = model, cache, device, capture
        self.max_tokens, self.max_batch, self.max_graphs = max_tokens, max_batch, max_graphs
        # every step's block table padded to the most blocks one sequence can hold, rounded as an
        # eager step's table is (the same rule), so that any step's table fits
        most = min(cache.num_blocks, -(-model.cfg.max_position_embeddings // cache.block_size))
        self.width = packing.table_width(most)
        self.graphs: "OrderedDict[StepShape, _Graph]" = OrderedDict()
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.stats = dict(captures=0, replays=0, eager=0, capture_s=0.0)
        self.failed: Optional[str] = None  # why a capture failed (then every step runs eagerly)

    def shape_of(self, tokens: torch.Tensor, meta: StepMeta, idx: Optional[torch.Tensor]) -> Optional[StepShape]:
        T, B = tokens.numel(), meta.cu_seqlens_q.numel() - 1
        if T > self.max_tokens or B > self.max_batch or B < 1 or meta.block_tables.shape[1] > self.width:
            return None
        rows = _pow2(T)
        words = 0 if meta.mask is None else -(-rows // 32)
        if meta.mask is not None and meta.mask.shape[1] > words:  # wider than its rows need: not ours to pad
            return None
        return self._shape(rows, _pow2(B), min(rows, _pow2(meta.max_seqlen_q)), meta.mask is not None,
                           meta.causal is not None)

    def _shape(self, rows: int, batch: int, max_q: int, tree: bool, causal: bool) -> StepShape:
        return StepShape(rows=rows, batch=batch, width=self.width, max_q=max_q, words=-(-rows // 32) if tree else 0,
                         causal=causal, logits=rows)

    def warm_up(self, batches: tuple[int, ...] = (1,)) -> int:
        """Capture now, for each batch size in ``batches`` (each padded to a power of two),
        the shape of every step it can take up to ``max_tokens`` rows, causal and with a tree
        mask: batch 1 steps of each row count (``max_q`` = the rows, 18 graphs); a batch of b
        sequences every ``max_q`` its padded rows allow (from rows / 2b, the fewest rows its
        longest sequence can have, up to the rows). A benchmark that decodes batches of 4
        passes (1, 2, 4): the batch shrinks as sequences finish. The graphs are captured on
        empty inputs (no sequence owns a row: nothing is written to the cache). Returns how
        many were captured; 0 without capture or after a failed one."""
        if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
            raise ValueError(f"batches must be a non-empty tuple of ints >= 1, got {batches!r}")
        done = 0
        rows = 1
        while self.capture and self.failed is None and rows <= self.max_tokens:
            for b in sorted({_pow2(b) for b in batches if 1 <= b <= min(rows, self.max_batch)}):
                max_qs = [rows] if b == 1 else [q for q in (1 << i for i in range(rows.bit_length()))
                                                if rows // (2 * b) <= q <= rows]
                for max_q in max_qs:
                    for tree in (False, True):
                        shape = self._shape(rows, b, max_q, tree, tree)
                        if shape in self.graphs:
                            continue
                        g = _Graph(shape, self.device)
                        if not self._try_capture(g):
                            return done
                        self.graphs[shape] = g
                        done += 1
            rows *= 2
        self._evict()
        return done

    def run(self, tokens: torch.Tensor, meta: StepMeta, idx: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        shape = self.shape_of(tokens, meta, idx)
        if shape is None:
            self.stats["eager"] += 1
            return None
        g = self._graph(shape)
        self._fill(g, tokens, meta, idx)
        return self.replay(g, tokens.numel() if idx is None else idx.numel())

    def stage(self, inputs: list, vocab: int, max_context: int) -> Optional[tuple[_Graph, int]]:
        """``inputs`` (checked by the runner: known sequences, none twice) packed on the host
        straight into the static inputs of their shape's graph, padded, and sent in one copy;
        their cache room reserved. The reference is ``ModelRunner.prepare`` and then ``run``'s
        ``_fill``: a step packed, then copied piece by piece into the graph (about 20 device
        copies and fills). Returns the graph and the step's logits rows for ``replay``; None,
        with nothing reserved, where ``run`` must take the step: too large for a graph, an
        explicit mask, the compiled packing off, or inputs its checks refuse."""
        B = len(inputs)
        if not 1 <= B <= self.max_batch or not packing.enabled():
            return None
        T = sum(len(inp.tokens) for inp in inputs)
        if not 1 <= T <= self.max_tokens or any(inp.mask is not None for inp in inputs):
            return None
        tree = any(inp.parents is not None for inp in inputs)
        rows = _pow2(T)
        shape = self._shape(rows, _pow2(B), min(rows, _pow2(max(len(inp.tokens) for inp in inputs))), tree, tree)
        g = self._graph(shape)
        if g.copied is not None:  # the last copy out of the host buffer must be done before it is written
            g.copied.synchronize()
        at = g.host.data_ptr()
        got = packing.pack_padded(self.cache, inputs, vocab, max_context,
                                  (rows, shape.batch, shape.width, shape.words, shape.logits), g.at32, g.at64,
                                  at + g.base32, at, at + g.causal_at if shape.causal else None)
        if got is None:
            return None
        if g.host is not g.dev:
            g.dev.copy_(g.host, non_blocking=True)
            if g.copied is None:
                g.copied = torch.cuda.Event()
            g.copied.record()
        return g, got[1]

    def _graph(self, shape: StepShape) -> _Graph:
        g = self.graphs.get(shape)
        if g is None:
            return _Graph(shape, self.device)
        self.graphs.move_to_end(shape)
        return g

    def replay(self, g: _Graph, R: int, eager_fallback: bool = False) -> Optional[torch.Tensor]:
        """The logits of the step in ``g``'s static inputs (its first ``R`` rows): captured on
        first use, replayed after. None where the capture fails, unless ``eager_fallback``
        (the step lives only in ``g``'s inputs: ``stage``): its padded step then runs eagerly."""
        shape = g.shape
        if not self.capture:  # the same padded step, eagerly (tests without a GPU)
            out = self._forward(g)
            self.graphs[shape] = g
            self._evict()
        elif g.graph is None:
            if not self._try_capture(g):
                self.stats["eager"] += 1
                return self._forward(g)[:R] if eager_fallback else None
            self.graphs[shape] = g
            self._evict()
            out = g.out
        else:
            g.graph.replay()
            self.stats["replays"] += 1
            out = g.out
        return out[:R].clone()  # the static output is rewritten by the next replay

    def _try_capture(self, g: _Graph) -> bool:
        try:
            self._capture(g)
        except Exception as e:  # noqa: BLE001 -- whatever failed, the eager forward still works
            warnings.warn(f"CUDA graph capture failed for {g.shape} ({type(e).__name__}: {e}); this runner's "
                          "steps run eagerly from now on")
            self.failed = f"{type(e).__name__}: {e}"
            self.max_tokens = 0  # nothing fits a graph any more
            return False
        return True

    def _forward(self, g: _Graph) -> torch.Tensor:
        return self.model(g.tokens, g.meta, self.cache.k, self.cache.v, g.idx)

    def _fill(self, g: _Graph, tokens, meta: StepMeta, idx) -> None:
        """Copy a step into ``g``'s static inputs, padding as the module docstring says."""
        T, B = tokens.numel(), meta.cu_seqlens_q.numel() - 1
        m, gm = meta, g.meta
        g.tokens[:T].copy_(tokens)
        gm.positions[:T].copy_(m.positions)
        gm.slot_mapping[:T].copy_(m.slot_mapping)
        if T < g.tokens.numel():  # earlier steps of this shape may have used more rows
            g.tokens[T:].zero_()
            gm.positions[T:].zero_()
            gm.slot_mapping[T:].fill_(-1)
        gm.cu_seqlens_q[:B + 1].copy_(m.cu_seqlens_q)
        gm.cu_seqlens_q[B + 1:].fill_(T)
        gm.context_lens[:B].copy_(m.context_lens)
        gm.context_lens[B:].zero_()
        W = m.block_tables.shape[1]
        gm.block_tables.fill_(-1)
        gm.block_tables[:B, :W].copy_(m.block_tables)
        if gm.mask is not None:
            w = m.mask.shape[1]
            gm.mask[:T, :w].copy_(m.mask)
            gm.mask[:T, w:].zero_()
            gm.mask[T:].zero_()
        if gm.causal is not None:
            gm.causal[:B].copy_(m.causal)
            gm.causal[B:].fill_(True)
        R = T if idx is None else idx.numel()
        if idx is None:
            torch.arange(T, out=g.idx[:T])
        else:
            g.idx[:R].copy_(idx)
        g.idx[R:].zero_()

    def _capture(self, g: _Graph) -> None:
        start = time.perf_counter()
        cur = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            self._forward(g)  # compiles the Triton kernels and warms cuBLAS outside the capture
        cur.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            g.out = self._forward(g)
        g.graph = graph
        graph.replay()  # the capture only recorded: this computes the step
        self.stats["captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - start

    def _evict(self) -> None:
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)


def use_cuda_graphs(model, enable: bool = True, **options) -> None:
    """Switch a model's decoding steps to CUDA-graph replay (``options``: those of
    ``StepGraphs``). Every ``ModelRunner`` made for the model afterwards replays its steps, and
    ``ModelRunner.for_batch`` reuses one runner (and so its graphs) while it is free and large
    enough. Checks the device and the backend now, before anything is captured."""
    if not enable:
        model.step_graphs, model.shared_runner = None, None
        return
    if model.backend.name != "triton":
        raise ValueError(f"cuda graphs need the triton kernel backend, the model runs {model.backend.name!r}; "
                         "use --kernel triton")
    options = {"capture": True, **options}  # capture=False: the padded steps run eagerly (tests)
    if options["capture"] and model.device.type != "cuda":
        raise ValueError(f"cuda graphs need a CUDA device, the model is on {model.device}; use --device cuda")
    model.step_graphs, model.shared_runner = options, None

