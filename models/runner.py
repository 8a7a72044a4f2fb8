"""The step interface between decoding methods and the model.

A decoding method hands the runner one ``StepInput`` per sequence (tokens, their position
offsets past the committed prefix, a T x T visibility mask, the rows that need logits); the
runner packs them into one forward over the paged cache and returns per-sequence logits.
After verification ``commit`` keeps the accepted tokens' K/V and drops the rest.
"""

import functools
from array import array
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, Optional

import torch

from kernels import quant, skinny
from kernels.backend import StepMeta
from kernels.mask import pack_mask, tree_mask_bytes
from kernels.rows import argmax_rows, argmax_topk_rows
from models import packing
from models.kv_cache import PagedKVCache
from models.llama import Transformer

# step tokens per sequence that a for_batch runner always has room for past the prompt and the
# answer: a step of a decoding method must not send more (decoding/inputs.py: lookahead_window)
STEP_TOKENS = 256


@dataclass
class StepInput:
    seq_id: int
    tokens: list[int]  # (T,) the first one is the last token not yet in the cache
    depths: Optional[list[int]] = None  # (T,) position - committed length; None = 0 .. T-1
    mask: Optional[torch.Tensor] = None  # (T, T) bool, row i = step tokens i sees; None = causal
    logits_rows: Optional[list[int]] = None  # rows that need logits; None = all
    # or the step as a tree: parents[i] < i is row i's parent (-1 for row 0); row i sees its
    # ancestors and itself. The same as the mask it implies, packed without building it
    parents: Optional[list[int]] = None


def _inference(f: Callable) -> Callable:
    """``torch.inference_mode()`` for a runner method, entered only where the caller is not in it
    already (``generate`` is): entering it costs about 1.7 us a call, a few calls a step."""
    @functools.wraps(f)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return f(*args, **kwargs)
        with torch.inference_mode():
            return f(*args, **kwargs)
    return run


class StepLogits:
    """One sequence's logits rows of a step, (R, vocab) fp32: rows ``start`` to ``start + R`` of
    the step's logits, or multiplied out from those rows of the final norm's on the first
    ``tensor()`` call (greedy decoding with an LM head screen reads only their argmax / top-k,
    which come with them, and never asks). Nothing is sliced until asked: a tensor op costs
    tens of microseconds when the forward has left the caches cold, and greedy steps seldom ask."""

    def __init__(self, model: Transformer, tensor: Optional[torch.Tensor] = None,
                 hidden: Optional[torch.Tensor] = None, start: int = 0, rows: Optional[int] = None):
        self._model, self._tensor, self._hidden = model, tensor, hidden
        self._start = start
        self._rows = (tensor if tensor is not None else hidden).shape[0] - start if rows is None else rows

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self._rows, self._model.cfg.vocab_size))

    def tensor(self) -> torch.Tensor:
        a, b = self._start, self._start + self._rows
        if self._tensor is None:
            with torch.inference_mode():
                self._tensor = self._model.head(self._hidden[a:b])
            self._hidden = None
        elif a or b != self._tensor.shape[0]:
            self._tensor = self._tensor[a:b]
        self._start = 0
        return self._tensor


def logits_tensor(x) -> torch.Tensor:
    """x itself when it is a tensor, else ``x.tensor()`` (a ``StepLogits``)."""
    return x if isinstance(x, torch.Tensor) else x.tensor()


class ModelRunner:
    def __init__(self, model: Transformer, cache_tokens: int = 8192, block_size: int = 16,
                 graphs: Optional[bool] = None):
        """``graphs``: replay steps from CUDA graphs (models/graphs.py); None = as the model was
        set up (``models.graphs.use_cuda_graphs``), off by default."""
        if cache_tokens < block_size:
            raise ValueError(f"cache_tokens must be >= block_size ({block_size}), got {cache_tokens}")
        self.model = model
        self.cfg = model.cfg
        self.device = model.device
        self.cache = PagedKVCache(model.cfg, -(-cache_tokens // block_size), block_size, model.kv_cache_dtype(),
                                  self.device)
        options = getattr(model, "step_graphs", None)
        if graphs is None:
            graphs = options is not None
        self.graphs = None
        if graphs:
            from models.graphs import StepGraphs
            self.graphs = StepGraphs(model, self.cache, **(options or {}))

    @classmethod
    def for_batch(cls, model: Transformer, prompts: list[list[int]], max_new_tokens: int,
                  max_step_tokens: int = STEP_TOKENS, block_size: int = 16) -> "ModelRunner":
        """A runner whose cache fits the batch in the worst case, so generation cannot run out.
        With CUDA graphs on (``models.graphs.use_cuda_graphs``) the model keeps one such runner
        and hands it out again while it holds no sequence and is large enough (its graphs
        point at its cache); a larger one replaces it, at least twice its size."""
        need = sum(-(-(len(p) + max_new_tokens + max_step_tokens) // block_size) for p in prompts)
        if getattr(model, "step_graphs", None) is None:
            return cls(model, cache_tokens=need * block_size, block_size=block_size)
        shared = getattr(model, "shared_runner", None)
        if shared is not None and shared.cache.block_size == block_size and not shared.seq_ids \
                and shared.cache.num_blocks >= need:
            return shared
        if shared is not None and shared.seq_ids:  # in use (nested generate): a runner of its own
            return cls(model, cache_tokens=need * block_size, block_size=block_size)
        blocks = max(need, 2 * shared.cache.num_blocks) if shared is not None else need
        model.shared_runner = None  # free the old cache and graphs before allocating the new ones
        model.shared_runner = cls(model, cache_tokens=blocks * block_size, block_size=block_size)
        return model.shared_runner

    @classmethod
    def warm_up_shared(cls, model: Transformer, batch: int, longest_prompt: int, max_new_tokens: int) -> dict:
        """Make the runner ``for_batch`` will hand out for ``batch`` prompts of up to
        ``longest_prompt`` tokens and capture its graphs now (``StepGraphs.warm_up`` for every
        power of two up to ``batch``), so that a benchmark's timed runs neither replace the runner (and capture
        again) nor capture on first use. Returns what it did: graphs captured, seconds, cache
        tokens, a failed capture. CUDA graphs must be on (``models.graphs.use_cuda_graphs``)."""
        if getattr(model, "step_graphs", None) is None:
            raise ValueError("warm_up_shared needs CUDA graphs on: call models.graphs.use_cuda_graphs(model) first")
        if batch < 1 or longest_prompt < 1 or max_new_tokens < 1:
            raise ValueError(f"batch, longest_prompt and max_new_tokens must be >= 1, got {batch}, {longest_prompt}, "
                             f"{max_new_tokens}")
        runner = cls.for_batch(model, [[0] * longest_prompt] * batch, max_new_tokens)
        before = runner.graphs.stats["capture_s"]
        # every power of two up to the batch: it shrinks as its sequences finish
        captured = runner.graphs.warm_up(tuple(1 << i for i in range((batch - 1).bit_length() + 1)))
        return dict(captured=captured, seconds=runner.graphs.stats["capture_s"] - before,
                    cache_tokens=runner.cache.num_blocks * runner.cache.block_size, failed=runner.graphs.failed)

    @property
    def max_context(self) -> int:
        return self.cfg.max_position_embeddings

    def add_sequence(self, seq_id: int) -> None:
        self.cache.add(seq_id)

    def free(self, seq_id: int) -> None:
        self.cache.free(seq_id)

    def warm_up_commit(self) -> None:
        """Run one commit that moves K/V (a step of 3 tokens keeping rows 0 and 2) on a scratch
        sequence, then free it: on a GPU the compaction kernel compiles here (one variant serves
        every width, kernels/kv_ops.py) instead of inside the first timed step that accepts a
        non-contiguous path."""
        sid = max(self.seq_ids, default=0) + 1
        self.add_sequence(sid)
        try:
            self.step([StepInput(sid, [0, 0, 0], parents=[-1, 0, 0])])
            self.commit({sid: [0, 2]})
        finally:
            self.free(sid)

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self.cache.lengths

    @property
    def seq_ids(self) -> list[int]:
        return list(self.cache.lengths)

    def context_len(self, seq_id: int) -> int:
        self.cache.check(seq_id)
        return self.cache.lengths[seq_id]

    def truncate(self, seq_id: int, length: int) -> None:
        """Forget the committed tokens past ``length`` (a draft model's rejected tokens)."""
        self.cache.truncate(seq_id, length)

    def assume_context(self, seq_id: int, length: int) -> None:
        """Mark ``length`` more positions of a sequence as committed without computing them:
        their K/V are whatever the pool holds. For benchmarks that time attention over a long
        prefix (its cost does not depend on the values); decoding never calls this."""
        self.cache.reserve({seq_id: length})
        self.cache.commit(seq_id, length)

    def _validate(self, inp: StepInput) -> list[int]:
        T = len(inp.tokens)
        if T == 0:
            raise ValueError(f"sequence {inp.seq_id}: a step needs at least one token")
        depths = list(range(T)) if inp.depths is None else list(inp.depths)
        if len(depths) != T:
            raise ValueError(f"sequence {inp.seq_id}: depths has {len(depths)} entries for {T} tokens")
        last = self.cache.lengths[inp.seq_id] + max(depths)
        if min(depths) < 0 or last >= self.max_context:
            raise ValueError(f"sequence {inp.seq_id}: step positions reach {last}, the model context is "
                             f"{self.max_context} tokens")
        if inp.mask is not None and tuple(inp.mask.shape) != (T, T):
            raise ValueError(f"sequence {inp.seq_id}: mask must be ({T}, {T}), got {tuple(inp.mask.shape)}")
        if inp.parents is not None:
            if inp.mask is not None:
                raise ValueError(f"sequence {inp.seq_id}: give a mask or parents, not both")
            par = list(inp.parents)
            if len(par) != T or par[0] != -1 or any(not 0 <= p < i for i, p in enumerate(par) if i):
                raise ValueError(f"sequence {inp.seq_id}: parents must have {T} entries, -1 first and then "
                                 f"0 <= parents[i] < i, got {par[:8]}{' ...' if len(par) > 8 else ''}")
        bad = [t for t in inp.tokens if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"sequence {inp.seq_id}: token ids must be in [0, {self.cfg.vocab_size}), got {bad[:3]}")
        return depths

    @_inference
    def step(self, inputs: list[StepInput], mark: Optional[Callable[[str], None]] = None) -> list[torch.Tensor]:
        """One forward for all ``inputs``; returns per input its logits rows (R_b, vocab) fp32.
        ``mark`` (a ``decoding.stats.StepClock.mark``) is told when the packing and the forward end."""
        logits = self._step_logits(inputs, mark)
        out, start = [], 0
        for inp in inputs:
            r = len(inp.tokens) if inp.logits_rows is None else len(inp.logits_rows)
            out.append(logits[start:start + r])
            start += r
        return out

    def _step_logits(self, inputs: list[StepInput], mark: Optional[Callable[[str], None]]) -> torch.Tensor:
        """The logits rows of the whole step, every input's in turn."""
        logits = None
        if self.graphs is not None and self.model.emulated_cost is None:  # packed into a graph's inputs
            self._check_ids(inputs)
            staged = self.graphs.stage(inputs, self.cfg.vocab_size, self.max_context)
            if staged is not None:
                if mark is not None:
                    mark("pack")
                logits = self.graphs.replay(*staged, eager_fallback=True)
        if logits is None:
            prepared = self.prepare(inputs, reuse=True)
            if mark is not None:
                mark("pack")
            logits = self.forward(*prepared)
        if mark is not None:
            mark("forward")
        return logits

    @_inference
    def step_greedy(self, inputs: list[StepInput], k: int = 1, mark: Optional[Callable[[str], None]] = None
                    ) -> list[tuple["StepLogits", list[int], Optional[list[list[int]]]]]:
        """``step`` for greedy decoding: per input (its logits rows, multiplied out only when
        asked; every row's argmax; for ``k`` > 1 every row's top-k, else None). Where the
        model has an LM head screen (``Transformer.head_screen``: an fp32 CPU head and a build
        with AVX512-BF16) the argmax and top-k come from it, the logits are not computed, and
        the answers are those of the skinny product's logits, bit for bit; elsewhere from the
        logits (``kernels.rows``), the whole step's rows reduced at once (on a GPU one read back
        per step, not one or two per sequence). ``k`` <= 1: the argmax alone."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"k must be an int >= 0 (the top-k each row needs; 0 or 1: the argmax), got {k!r}")
        ranked = self._ranked_head(k)  # a quantized head (the CPU default) has no screen: asked first
        if ranked or self.head_screen(k) is None:
            if ranked:  # the quantized head's logits with their top-k (kernels.quant)
                prepared = self.prepare(inputs, reuse=True)
                if mark is not None:
                    mark("pack")
                logits, top1, topk = self._forward_ranked(*prepared, k=k)
                if mark is not None:
                    mark("forward")
            else:
                logits = self._step_logits(inputs, mark)
                kk = max(1, min(k, logits.shape[-1]))
                top1, topk = argmax_topk_rows(logits, kk) if kk > 1 else (argmax_rows(logits), None)
            out, start = [], 0
            for inp in inputs:
                r = len(inp.tokens) if inp.logits_rows is None else len(inp.logits_rows)
                out.append((StepLogits(self.model, tensor=logits, start=start, rows=r), top1[start:start + r],
                            None if topk is None else topk[start:start + r]))
                start += r
            return out
        prepared = self.prepare(inputs, reuse=True)
        if mark is not None:
            mark("pack")
        h, top = self.forward_screened(*prepared, k=k)
        if mark is not None:
            mark("forward")
        out, start = [], 0
        for inp in inputs:
            r = len(inp.tokens) if inp.logits_rows is None else len(inp.logits_rows)
            rows = top[start:start + r]
            out.append((StepLogits(self.model, hidden=h, start=start, rows=r), [t[0] for t in rows],
                        rows if k > 1 else None))
            start += r
        return out

    def _ranked_head(self, k: int) -> bool:
        """Whether greedy steps take the argmax and top-``k`` from the quantized LM head's own call
        (``kernels.quant.quant_linear_topk``): eager forwards of a CPU model with a quantized head,
        its cost not emulated (an emulated forward is padded before the head would run)."""
        return (self.model.head_quant is not None and self.graphs is None and self.model.emulated_cost is None
                and k <= skinny.MAX_TOPK)

    @_inference
    def _forward_ranked(self, tokens: torch.Tensor, meta: StepMeta, idx: Optional[torch.Tensor], k: int = 1
                        ) -> tuple[torch.Tensor, list[int], Optional[list[list[int]]]]:
        """The forward of a prepared step with a quantized LM head (``_ranked_head``): the logits,
        every row's argmax, and for ``k`` > 1 every row's top-k, as ``argmax_topk_rows`` of the
        logits would give them."""
        h = self.forward(tokens, meta, idx, hidden=True)
        kk = max(1, min(k, self.cfg.vocab_size))
        # the rows are this forward's (fp32, contiguous) and the head was checked when it was packed
        logits, top1, topk = quant.topk_unchecked(skinny._require(), h.contiguous(), self.model.head_quant, kk,
                                                  skinny._threads(None))
        return logits, top1, (topk if kk > 1 else None)

    def head_screen(self, k: int = 1) -> Optional[skinny.HeadScreen]:
        """The model's LM head screen where greedy steps of this runner use it (``step_greedy``)
        for a top-``k``: eager forwards (no CUDA graphs), k <= ``kernels.skinny.MAX_TOPK``."""
        return self.model.head_screen() if self.graphs is None and k <= skinny.MAX_TOPK else None

    @_inference
    def forward_greedy(self, tokens: torch.Tensor, meta: StepMeta, idx: Optional[torch.Tensor], k: int = 1) -> None:
        """What a greedy step's forward costs (``step_greedy``): the screened head where the
        runner has one, else the logits. For the step-cost measurement (models/cost.py)."""
        if self.head_screen(k) is not None:
            self.forward_screened(tokens, meta, idx, k)
        elif self._ranked_head(k):
            self._forward_ranked(tokens, meta, idx, k)
        else:
            self.forward(tokens, meta, idx)

    @_inference
    def forward_screened(self, tokens: torch.Tensor, meta: StepMeta, idx: Optional[torch.Tensor], k: int = 1
                         ) -> tuple[torch.Tensor, list[list[int]]]:
        """The forward of a prepared step up to the final norm's rows h (R, hidden), and every
        row's top-``k`` token ids from the LM head's screen (``head_screen(k)`` must be set)."""
        h = self.forward(tokens, meta, idx, hidden=True).contiguous()
        kk = max(1, min(k, self.cfg.vocab_size))
        ids, bad = skinny.head_topk(h, self.head_screen(k), kk)
        top = ids.tolist()
        for r in bad:  # a screen that is not finite (a NaN or inf row): that row's logits, reduced by torch
            row = self.model.head(h[r:r + 1])
            top[r] = row.topk(kk, dim=-1).indices[0].tolist()
            top[r][0] = int(row.argmax())
        return h, top

    @_inference
    def forward(self, tokens: torch.Tensor, meta: StepMeta, idx: Optional[torch.Tensor],
                hidden: bool = False) -> torch.Tensor:
        """The forward of a prepared step (``prepare``): replayed from a CUDA graph where this
        runner has them and the step fits one, else eager. Logits (R, vocab) fp32, or with
        ``hidden`` the final norm's rows (R, hidden) (eager only)."""
        emulated = self.model.emulated_cost  # models.cost.Emulation or None
        start = emulated.clock() if emulated is not None else 0.0
        logits = self.graphs.run(tokens, meta, idx) if self.graphs is not None and not hidden else None
        if logits is None:
            logits = self.model(tokens, meta, self.cache.k, self.cache.v, idx, hidden=hidden)
        if emulated is not None:  # padded to the emulated curve's time (this waits for the device)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            cu = meta.cu_seqlens_q.tolist()
            emulated.pad(start, [b - a for a, b in zip(cu, cu[1:])], meta.context_lens.tolist())
        return logits

    def prepare(self, inputs: list[StepInput], reuse: bool = False
                ) -> tuple[torch.Tensor, StepMeta, Optional[torch.Tensor]]:
        """Check ``inputs``, reserve cache room for them and pack them into the model's
        arguments ``(tokens, meta, logits_idx)``; the forward is ``model(tokens, meta,
        cache.k, cache.v, logits_idx)``. Nothing is committed: calling the forward again with
        the same arguments rewrites the same slots (the step benchmarks rely on this).
        ``reuse`` (the runner's own steps, done with a step's tensors before the thread packs
        another): on a host device the step is written into the thread's buffers and returned as
        their kept views (``models.packing.thread_staging``) instead of new tensors."""
        cache = self.cache
        if reuse and self.device.type == "cpu":  # the common case in one call (models.packing.staged)
            packed = packing.staged(cache, inputs, self.cfg.vocab_size, self.cfg.max_position_embeddings)
            if packed is not None:
                return packed
        self._check_ids(inputs)
        if packing.enabled():  # the compiled twin (models/packing.py); None: the reference below takes it
            packed = packing.pack(cache, inputs, self.cfg.vocab_size, self.max_context, self.device,
                                  packing.thread_staging() if reuse else None)
            if packed is not None:
                return packed
        return self._prepare_ref(inputs)

    def _check_ids(self, inputs: list[StepInput]) -> None:
        blocks = self.cache.blocks
        for inp in inputs:
            if inp.seq_id not in blocks:
                self.cache.check(inp.seq_id)  # raises, naming it
        if len(inputs) > 1 and len(set(map(attrgetter("seq_id"), inputs))) != len(inputs):
            raise ValueError("a sequence may appear only once in a step")

    def _prepare_ref(self, inputs: list[StepInput]) -> tuple[torch.Tensor, StepMeta, Optional[torch.Tensor]]:
        """``prepare`` in Python after its first checks: the reference of models/packing.py."""
        cache = self.cache
        all_depths = [self._validate(inp) for inp in inputs]
        cache.reserve({inp.seq_id: len(inp.tokens) for inp in inputs})  # all or nothing

        tokens, positions, slots, cu, logits_idx = [], [], [], [0], []
        tree = [inp.mask is not None or inp.parents is not None for inp in inputs]  # not causal
        bs = cache.block_size
        for inp, depths in zip(inputs, all_depths):
            ctx, T = cache.lengths[inp.seq_id], len(inp.tokens)
            tokens += inp.tokens
            positions += [ctx + d for d in depths]
            blocks = cache.blocks[inp.seq_id]
            slots += [blocks[j // bs] * bs + j % bs for j in range(ctx, ctx + T)]
            start = cu[-1]
            logits_idx += range(start, start + T) if inp.logits_rows is None else [start + r for r in inp.logits_rows]
            cu.append(start + T)
        seq_ids = [inp.seq_id for inp in inputs]
        lens = [cache.lengths[s] for s in seq_ids]
        width = packing.table_width(max(len(cache.blocks[s]) for s in seq_ids))
        table: list[int] = []
        for s in seq_ids:
            table += cache.blocks[s]
            table += [-1] * (width - len(cache.blocks[s]))
        mask_words = n_words = None
        if any(tree):
            n_words = -(-max(len(inp.tokens) for inp, t in zip(inputs, tree) if t) // 32)
            mask_words = bytearray()  # (rows, n_words) int32 in the host's byte order
            for inp in inputs:
                if inp.parents is not None:
                    mask_words += tree_mask_bytes(inp.parents, n_words)
                elif inp.mask is not None:
                    words = pack_mask(inp.mask.cpu())
                    mask_words += torch.nn.functional.pad(words, (0, n_words - words.shape[1])).numpy().tobytes()
                else:
                    mask_words += bytes(4 * len(inp.tokens) * n_words)
        idx_list = None if len(logits_idx) == cu[-1] else logits_idx
        # The step's integers go to the device in two copies (one per dtype), each piece a view
        # of them: on a GPU every copy is a host round trip of its own (8 of them per step before).
        # Each piece starts 16 bytes aligned, as a tensor of its own would: Triton specialises
        # kernels on pointer alignment, and a piece at an odd offset would compile another variant.
        # The host side is one flat array per dtype (no tensor per piece: on a CPU building them
        # had been most of a one-token step's packing).
        dev = self.device
        v32 = _packed(array("i"), [cu, positions, lens, table] + ([] if mask_words is None else [mask_words]), 4,
                      torch.int32, dev)
        v64 = _packed(array("q"), [tokens, slots] + ([] if idx_list is None else [idx_list]), 2, torch.int64, dev)
        meta = StepMeta(
            cu_seqlens_q=v32[0],
            positions=v32[1],
            block_tables=v32[3].view(len(seq_ids), width),
            context_lens=v32[2],
            slot_mapping=v64[1],
            max_seqlen_q=max(len(inp.tokens) for inp in inputs),
            mask=None if mask_words is None else v32[4].view(cu[-1], n_words),
            causal=None if mask_words is None else torch.tensor([not t for t in tree], dtype=torch.bool, device=dev),
        )
        return v64[0], meta, None if idx_list is None else v64[2]

    @_inference
    def commit(self, accepted: dict[int, list[int]]) -> None:
        """Keep, per sequence, the K/V of the accepted step rows (increasing, usually starting
        with 0) as the next committed tokens; everything else of the step is dropped."""
        cache = self.cache
        if packing.commit(cache, accepted):  # the compiled twin, on a host cache (the Python below: its reference)
            return
        moving = {}
        for s, rows in accepted.items():
            cache.check(s)
            if not rows:
                continue
            if rows[0] < 0 or any(b <= a for a, b in zip(rows, rows[1:])):
                raise ValueError(f"sequence {s}: accepted rows must be increasing and >= 0, got {rows}")
            if cache.lengths[s] + rows[-1] + 1 > cache.capacity(s):
                raise ValueError(f"sequence {s}: accepted row {rows[-1]} lies outside the last step")
            if rows[-1] != len(rows) - 1:  # increasing from 0 and ending at len - 1: 0, 1, 2, ... (no move)
                moving[s] = rows
        if moving and packing.compacts(cache):  # the compiled twin, on a host cache
            packing.compact(cache, moving)
        elif moving:
            self.model.backend.kv_compact(cache.k, cache.v, *compaction_args(cache, moving, self.device))
        for s, rows in accepted.items():
            cache.lengths[s] += len(rows)  # checked above: within the reserved capacity


def compaction_args(cache: PagedKVCache, moving: dict[int, list[int]], device) -> tuple[torch.Tensor, ...]:
    """The backend's ``kv_compact`` arguments after the caches (block tables (B, W), context
    lengths (B,), accepted rows (B, A) padded with -1, their counts (B,), int32) for the
    sequences in ``moving``: one int32 array, sent in one copy (on a GPU each tensor made on
    the device from a list was a copy of its own)."""
    seq_ids = list(moving)
    B = len(seq_ids)
    W = max(1, max(len(cache.blocks[s]) for s in seq_ids))
    A = max(len(r) for r in moving.values())
    flat = array("i")
    for s in seq_ids:
        flat.extend(cache.blocks[s])
        flat.extend([-1] * (W - len(cache.blocks[s])))
    flat.extend(cache.lengths[s] for s in seq_ids)
    for s in seq_ids:
        flat.extend(moving[s])
        flat.extend([-1] * (A - len(moving[s])))
    flat.extend(len(moving[s]) for s in seq_ids)
    t = torch.frombuffer(flat, dtype=torch.int32).to(device)
    table, lens, idx, counts = t.split([B * W, B, B * A, B])
    return table.view(B, W), lens, idx.view(B, A), counts


def _packed(buf: array, parts: list, align: int, dtype: torch.dtype, device) -> list[torch.Tensor]:
    """``parts`` (lists of ints, or the bytes of ``buf``'s type) copied to ``device`` as one
    tensor of ``dtype`` (``buf``: an empty array of its type code), each starting at a multiple
    of ``align`` elements; returns the parts' views of it."""
    sizes = []
    for p in parts:
        n = len(buf)
        if isinstance(p, (bytes, bytearray)):
            buf.frombytes(p)
        else:
            buf.extend(p)
        pad = -len(buf) % align
        buf.extend(bytes(pad))
        sizes += [len(buf) - pad - n, pad]
    # the tensor shares buf's memory and holds a reference to it (on the CPU, .to is a no-op)
    dev = (torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)).to(device)
    return list(dev.split(sizes)[::2])
