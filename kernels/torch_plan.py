"""The torch backend's fast path: what every layer's attention and KV write share within a
step (block views or gather indices, visibility masks, the slots) is worked out once per
forward by ``plan_step`` instead of once per layer (30 times for the default model).

``tree_attention_ref`` and ``kv_store_ref`` stay the readable definitions (layout:
``kernels/__init__``); tests hold this path to them. On an x86 CPU in fp32 a sequence's step of
at most ``SMALL_ROWS`` rows is attended by the skinny C kernel (kernels/skinny.py: reads the
paged blocks in place, no gather, no SDPA call per sequence), and so is a tree step of any size
(its rows then do not depend on the step's size); a prompt's rows under the causal
rule (with or without a committed prefix) by the prefill kernel (``skinny.prefill_attention``,
1.3-2.3x SDPA's speed on the default model's shape: bench/results/2026-11-27-cpu-prefill-kernel/
NOTES.md); other dtypes, devices and masks by SDPA.
"""

from typing import Optional

import torch

from kernels import skinny
from kernels.mask import unpack_mask

# Steps of at most this many rows per sequence (a decoding step's most: models/linear.STEP_ROWS)
# go to the skinny CPU attention kernel (fp32, x86 with a C compiler: kernels/skinny.py); prefill
# to the prefill kernel, everything else to SDPA. The C kernel reads each key once per step, and
# it keeps such a step on the one-call layer stack, which SDPA cannot join: the whole forward at
# 24-64 rows is 0-15% faster with it than with SDPA (bench/results/2026-11-26-cpu-roofline/NOTES.md).
SMALL_ROWS = 64


class SeqPlan:
    """One sequence of a step: what its attention reads, worked out once for every layer. The
    block view or gather (``first_block``, ``blocks``: SDPA's path) is made on first use only
    (the CPU kernels read ``block_ids``)."""

    def __init__(self, start: int, end: int, length: int, table_row: torch.Tensor, n_blk: int,
                 mask: Optional[torch.Tensor], causal: bool, block_ids: Optional[torch.Tensor] = None,
                 prefill_ids: Optional[torch.Tensor] = None, tail_causal: bool = False):
        self.start, self.end = start, end  # query rows start:end of the packed step
        self.length = length  # keys: committed prefix + step
        self.table_row = table_row  # (n_blk,) the sequence's physical blocks, from the step's block table
        self.n_blk = n_blk
        self._mask = mask
        self.causal = causal  # SDPA's own causal rule (a whole causal prefill without a prefix)
        # the causal rule after the committed prefix (row t sees keys j <= t + length - T): the C
        # kernels take it as a flag (``mask`` makes its bytes on first use, for SDPA)
        self.tail_causal = tail_causal
        self.block_ids = block_ids  # (n_blk,) int32 physical blocks (CPU: the skinny kernel's input)
        # the causal rule after the committed prefix, no window (row t sees keys j <= t + length - T),
        # with the int32 blocks: the CPU prefill kernel's case (a prompt, or a chunk of one)
        self.prefill_ids = prefill_ids
        self._gather: Optional[tuple] = None

    @property
    def mask(self) -> Optional[torch.Tensor]:
        """(T, length) bool visibility; None = every key visible."""
        if self._mask is None and self.tail_causal:
            T = self.end - self.start
            self._mask = torch.ones(T, self.length, dtype=torch.bool, device=self.table_row.device).tril(
                diagonal=self.length - T)
        return self._mask

    def _blocks(self) -> tuple[Optional[int], Optional[torch.Tensor]]:
        if self._gather is None:
            row = self.table_row.tolist()
            first = row[0] if row == list(range(row[0], row[0] + self.n_blk)) else None
            self._gather = (first, None if first is not None else self.table_row.to(torch.int64))
        return self._gather

    @property
    def first_block(self) -> Optional[int]:
        """The sequence's blocks are first_block, first_block + 1, ...: a view (else None)."""
        return self._blocks()[0]

    @property
    def blocks(self) -> Optional[torch.Tensor]:
        """(n_blk,) int64 physical blocks where they are not consecutive (a gather), else None."""
        return self._blocks()[1]


class StepPlan:
    """A step's sequences, and its K/V slots as the per-layer store reads them (made on first
    use: the one-call CPU layer stack takes the slot mapping as it is)."""

    def __init__(self, seqs: list[SeqPlan], slot_mapping: torch.Tensor):
        self.seqs, self.slot_mapping = seqs, slot_mapping
        self._slots: Optional[tuple] = None

    def _slot_parts(self) -> tuple:
        if self._slots is None:
            slots = self.slot_mapping.long()
            flat = slots.tolist()
            start = flat[0] if flat and flat == list(range(flat[0], flat[0] + len(flat))) and flat[0] >= 0 else None
            valid = slots >= 0
            keep = None if all(x >= 0 for x in flat) else valid.nonzero().flatten()
            self._slots = (start, slots[valid], keep)
        return self._slots

    @property
    def slot_start(self) -> Optional[int]:
        """Every step slot is slot_start, slot_start + 1, ...: a slice write (else None)."""
        return self._slot_parts()[0]

    @property
    def slots(self) -> torch.Tensor:
        """(n,) int64 the valid slots (the -1 = skip ones removed)."""
        return self._slot_parts()[1]

    @property
    def keep(self) -> Optional[torch.Tensor]:
        """(n,) rows of the step whose slot is valid; None = all."""
        return self._slot_parts()[2]


def plan_step(cu_seqlens_q: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor,
              context_lens: torch.Tensor, slot_mapping: torch.Tensor, mask: Optional[torch.Tensor],
              causal: Optional[torch.Tensor], block_size: int, sliding_window: Optional[int]) -> StepPlan:
    """Arguments as for ``tree_attention_ref`` / ``kv_store_ref``; one host read of the metadata.
    On a CPU a sequence's int32 block ids are a view of the step's table where it holds int32
    (the packed steps' staging), and a tree's visibility is unpacked in one C call."""
    dev = positions.device
    cu, ctx = cu_seqlens_q.tolist(), context_lens.tolist()
    B = len(cu) - 1
    is_causal = [True] * B if mask is None else ([False] * B if causal is None else causal.tolist())
    on_cpu = dev.type == "cpu"
    views = on_cpu and block_tables.dtype == torch.int32 and block_tables.is_contiguous()
    seqs = []
    for b in range(B):
        s, e, C = cu[b], cu[b + 1], ctx[b]
        T = e - s
        if T == 0:
            continue
        L = C + T
        # no two of the sequence's positions (0 .. L - 1) lie a window apart: the window hides nothing
        window = sliding_window if sliding_window is not None and L > sliding_window else None
        n_blk = -(-L // block_size)
        row = block_tables[b, :n_blk]
        vis, sdpa_causal, tail = None, False, False
        if is_causal[b]:
            if T > 1 and C == 0 and window is None:
                sdpa_causal = True
            elif T > 1 and window is None:
                tail = True  # SeqPlan.mask makes the bytes where a path needs them
            elif T > 1:
                vis = torch.ones(T, L, dtype=torch.bool, device=dev).tril(diagonal=C)
        else:
            vis = skinny.visibility(mask[s:e], C) if on_cpu else None
            if vis is None:
                vis = torch.ones(T, L, dtype=torch.bool, device=dev)
                vis[:, C:] = unpack_mask(mask[s:e], T)
        if window is not None:
            q_pos = positions[s:e].long()
            k_pos = torch.cat([torch.arange(C, device=dev), q_pos])
            in_window = (q_pos[:, None] - k_pos[None, :]) < window
            vis = in_window if vis is None else vis & in_window
        cpu_ids = None
        if on_cpu:
            cpu_ids = row if views else row.to(torch.int32).contiguous()
        # a tree step of any size too: its rows must not depend on the step's size (the skinny
        # kernel's do, bit for bit; SDPA rounds otherwise), or greedy speculation could differ
        # from plain greedy decoding; quantized products amplify a rounding into a changed token
        ids = cpu_ids if T <= SMALL_ROWS or not is_causal[b] else None
        prefill = cpu_ids if is_causal[b] and T > 1 and window is None else None
        seqs.append(SeqPlan(s, e, L, row, n_blk, None if vis is None else vis.contiguous(), sdpa_causal, ids, prefill,
                            tail))
    return StepPlan(seqs, slot_mapping)


def kv_store_planned(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     plan: StepPlan) -> None:
    """``kv_store_ref`` for one layer's 4-D caches."""
    nb, bs, n_kv, d = k_cache.shape
    kc, vc = k_cache.view(nb * bs, n_kv, d), v_cache.view(nb * bs, n_kv, d)
    if plan.slot_start is not None:
        kc[plan.slot_start:plan.slot_start + k.shape[0]] = k
        vc[plan.slot_start:plan.slot_start + v.shape[0]] = v
    elif plan.keep is None:
        kc[plan.slots] = k.to(kc.dtype)
        vc[plan.slots] = v.to(vc.dtype)
    else:
        kc[plan.slots] = k[plan.keep].to(kc.dtype)
        vc[plan.slots] = v[plan.keep].to(vc.dtype)


def attention_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: StepPlan,
                      scale: float) -> torch.Tensor:
    """``tree_attention_ref`` for one layer: q (T_total, H, D) -> (T_total, H, D)."""
    n_kv, head_dim = k_cache.shape[2], k_cache.shape[3]
    gqa = q.shape[1] != n_kv
    compute = torch.float32 if q.dtype != torch.float32 else None  # fp32 math, as the reference
    small = (q.dtype == torch.float32 and q.device.type == "cpu" and head_dim % 8 == 0
             and q.stride(2) == 1 and q.stride(1) == head_dim
             and q.shape[1] // n_kv <= skinny.MAX_GROUP and k_cache.is_contiguous() and skinny.available()
             and (k_cache.dtype == torch.float32 or (k_cache.dtype == torch.float16 and skinny.kv16_available())))
    # the prefill kernel where the skinny one is not taken (a step of few rows after a prefix stays
    # on the skinny kernel: models/llama.py runs those steps' whole layer stack in one C call)
    prefill = small and q.shape[1] // n_kv <= skinny.MAX_PREFILL_GROUP and head_dim % skinny.prefill_dim_multiple() == 0
    outs = []
    for sp in plan.seqs:
        if prefill and sp.prefill_ids is not None and (sp.block_ids is None or sp.causal):
            outs.append(skinny.prefill_unchecked(q[sp.start:sp.end], k_cache, v_cache, sp.prefill_ids, sp.length,
                                                 scale))
            continue
        if small and sp.block_ids is not None and not sp.causal:
            outs.append(skinny.attention_unchecked(q[sp.start:sp.end], k_cache, v_cache, sp.block_ids, sp.length,
                                                   None if sp.tail_causal else sp.mask, sp.tail_causal, scale))
            continue
        if sp.first_block is not None:
            k = k_cache[sp.first_block:sp.first_block + sp.n_blk]
            v = v_cache[sp.first_block:sp.first_block + sp.n_blk]
        else:
            k, v = k_cache[sp.blocks], v_cache[sp.blocks]
        k = k.reshape(-1, n_kv, head_dim)[:sp.length].transpose(0, 1)[None]  # (1, KV, L, D)
        v = v.reshape(-1, n_kv, head_dim)[:sp.length].transpose(0, 1)[None]
        qs = q[sp.start:sp.end].transpose(0, 1)[None]  # (1, H, T, D)
        if compute is not None:
            qs, k, v = qs.to(compute), k.to(compute), v.to(compute)
        elif k.dtype != qs.dtype:  # an fp16 cache beside fp32 rows: widened (exactly)
            k, v = k.to(qs.dtype), v.to(qs.dtype)
        o = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=sp.mask, is_causal=sp.causal,
                                                             scale=scale, enable_gqa=gqa)
        outs.append(o[0].transpose(0, 1))  # (T, H, D)
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out if compute is None else out.to(q.dtype)
