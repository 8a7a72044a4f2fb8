"""Kernel backend chosen once (``--kernel triton | torch``) and passed down explicitly."""

import abc
import os
from dataclasses import dataclass
from typing import Optional

import torch

from kernels import kv_ops, ngram_match as ngram_mod, torch_plan, tree_attention as attn_mod


@dataclass
class StepMeta:
    """Per-step attention metadata, shared by all layers (layout: ``kernels/__init__``)."""

    cu_seqlens_q: torch.Tensor  # (B + 1,) int32
    positions: torch.Tensor  # (T_total,) int32
    block_tables: torch.Tensor  # (B, max_blocks) int32
    context_lens: torch.Tensor  # (B,) int32
    slot_mapping: torch.Tensor  # (T_total,) int64
    max_seqlen_q: int
    mask: Optional[torch.Tensor] = None  # (T_total, n_words) int32, None = every sequence causal
    causal: Optional[torch.Tensor] = None  # (B,) bool


class Backend(abc.ABC):
    """The four kernel entry points the model and the decoders use."""

    name = "base"

    def plan(self, meta: StepMeta, block_size: int, sliding_window: Optional[int]):
        """Work shared by every layer of one step, done once per forward (None: nothing)."""
        return None

    @abc.abstractmethod
    def attention(self, q, k_cache, v_cache, meta: StepMeta, scale: float, sliding_window: Optional[int],
                  plan=None):
        """See the matching function in kernels/."""

    @abc.abstractmethod
    def kv_store(self, k_cache, v_cache, k, v, slot_mapping, plan=None) -> None:
        """See the matching function in kernels/."""

    @abc.abstractmethod
    def kv_compact(self, k_cache, v_cache, block_tables, context_lens, accept_idx, accept_counts) -> None:
        """See the matching function in kernels/."""

    @abc.abstractmethod
    def ngram_match(self, tokens, cu_seqlens, **kw):
        """See the matching function in kernels/."""

    # True: ``ngram_match_lists`` searches the host's lists itself (no device mirror helps it)
    searches_on_host = False
    # True: a row's result does not depend on the step it is in, bit for bit (``TritonBackend``'s
    # ``exact``): the model then issues every product through kernels/exact_linear.py
    exact = False
    # True: the model's small steps are one launch each instead of several torch ops: every
    # RMSNorm (``kernels.norm``, the residual add before a layer's second norm included), RoPE
    # and silu * up (``kernels.elementwise``)
    fused_ops = False

    def ngram_match_lists(self, histories: list[list[int]], device="cpu", **kw) -> list[list[list[int]]]:
        """``ngram_match`` for histories held as lists: they go to ``device`` in one tensor, the
        kernel runs once, and each history's found continuations come back as lists.
        (``decoding.prompt_lookup.DeviceHistories`` keeps them on the device instead.)"""
        lens = [len(h) for h in histories]
        cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
        flat = torch.tensor([t for h in histories for t in h], dtype=torch.int32)
        return self.ngram_match_found(flat.to(device), cu.to(device), **kw)

    def ngram_match_found(self, tokens, cu_seqlens, **kw) -> list[list[list[int]]]:
        """``ngram_match`` on histories already on the device; per history its found
        continuations as lists (the step's one transfer to the host)."""
        cands, counts = self.ngram_match(tokens, cu_seqlens, **kw)
        cands, counts = cands.tolist(), counts.tolist()
        return [[row[:n] for row, n in zip(cands[b], counts[b]) if n > 0] for b in range(len(counts))]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class TorchBackend(Backend):
    """Pure-torch references: readable, any device, the ground truth for tests."""

    name = "torch"

    def plan(self, meta, block_size, sliding_window):
        return torch_plan.plan_step(meta.cu_seqlens_q, meta.positions, meta.block_tables, meta.context_lens,
                                    meta.slot_mapping, meta.mask, meta.causal, block_size, sliding_window)

    def attention(self, q, k_cache, v_cache, meta, scale, sliding_window, plan=None):
        if plan is not None:  # the same computation, with the per-step work done once (kernels/torch_plan.py)
            return torch_plan.attention_planned(q, k_cache, v_cache, plan, scale)
        return attn_mod.tree_attention_ref(
            q, k_cache, v_cache, meta.cu_seqlens_q, meta.positions, meta.block_tables, meta.context_lens,
            mask=meta.mask, causal=meta.causal, scale=scale, sliding_window=sliding_window)

    def kv_store(self, k_cache, v_cache, k, v, slot_mapping, plan=None):
        if plan is not None:
            torch_plan.kv_store_planned(k_cache, v_cache, k, v, plan)
        else:
            kv_ops.kv_store_ref(k_cache, v_cache, k, v, slot_mapping)

    def kv_compact(self, k_cache, v_cache, block_tables, context_lens, accept_idx, accept_counts):
        kv_ops.kv_compact_ref(k_cache, v_cache, block_tables, context_lens, accept_idx, accept_counts)

    def ngram_match(self, tokens, cu_seqlens, **kw):
        return ngram_mod.ngram_match_ref(tokens, cu_seqlens, **kw)

    searches_on_host = True

    def ngram_match_lists(self, histories, device="cpu", **kw):
        # the reference is a host loop whatever the device: search the lists where they are
        return ngram_mod.ngram_match_lists(histories, **kw)


class TritonBackend(Backend):
    """Triton kernels. On a machine without a GPU they run under Triton's interpreter, which
    must be switched on (TRITON_INTERPRET=1) before ``kernels`` is first imported.

    ``exact``: every row of a step is computed as it would be in a step of its own, bit for bit
    (docs/DESIGN.md, "The exact path"): the model's products and LM head go through
    ``kernels.exact_linear`` (one tile and K order for every row count), attention walks each
    row's keys in one order (``tree_attention(exact=True)``), and the small steps are the fused
    per-row kernels (torch's reductions may change order with the row count). So a verification
    step's logits are those of plain decoding in any dtype, and greedy drafts give ``ar``'s tokens
    in bf16 too."""

    name = "triton"

    def __init__(self, exact: bool = False):
        if not isinstance(exact, bool):
            raise ValueError(f"exact must be True or False, got {exact!r}")
        self.exact = exact
        fused_env = os.environ.get("SPECDEC_FUSED", "1") != "0"
        if exact and not fused_env:
            raise ValueError("the exact path needs the fused per-row kernels for RMSNorm, RoPE and silu * up "
                             "(torch's reductions may change order with a step's rows): unset SPECDEC_FUSED=0")
        # On a GPU the small steps are one launch each (SPECDEC_FUSED=0: the torch ops); under
        # the CPU interpreter the torch ops are far cheaper (tests switch it on to check the
        # fused forward there), except on the exact path, whose forward is the GPU's everywhere
        self.fused_ops = fused_env and (exact or not triton_interpreted())

    def plan(self, meta, block_size, sliding_window):
        # the exact attention's tree rows walk their keys through one table a step, made once
        if self.exact and meta.mask is not None:
            return attn_mod.step_order(meta.mask, meta.cu_seqlens_q, meta.max_seqlen_q, meta.causal)
        return None

    def attention(self, q, k_cache, v_cache, meta, scale, sliding_window, plan=None):
        return attn_mod.tree_attention(
            q, k_cache, v_cache, meta.cu_seqlens_q, meta.positions, meta.block_tables, meta.context_lens,
            mask=meta.mask, causal=meta.causal, scale=scale, sliding_window=sliding_window,
            max_seqlen_q=meta.max_seqlen_q, exact=self.exact, key_order=plan if self.exact else None)

    def kv_store(self, k_cache, v_cache, k, v, slot_mapping, plan=None):
        kv_ops.kv_store(k_cache, v_cache, k, v, slot_mapping)

    def kv_compact(self, k_cache, v_cache, block_tables, context_lens, accept_idx, accept_counts):
        kv_ops.kv_compact(k_cache, v_cache, block_tables, context_lens, accept_idx, accept_counts)

    def ngram_match(self, tokens, cu_seqlens, **kw):
        return ngram_mod.ngram_match(tokens, cu_seqlens, **kw)

    def __repr__(self) -> str:
        return f"TritonBackend(exact={self.exact})"


def triton_interpreted() -> bool:
    """Whether Triton kernels were decorated in interpreter mode (decided at import time)."""
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except ImportError:  # older Triton
        import os
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def get_backend(name: str, device: torch.device | str = "cpu", exact: bool = False) -> Backend:
    """``name`` in {"torch", "triton"}. Triton on a CPU device needs the interpreter. ``exact``:
    the Triton kernels' exact path (``TritonBackend``); the torch backend has none."""
    device = torch.device(device)
    if name == "torch":
        if exact:
            raise ValueError("the exact path (--exact, exact=True) runs on the Triton kernels, not the torch "
                             "backend: use --kernel triton (on a CPU it runs interpreted)")
        return TorchBackend()
    if name == "triton":
        if device.type != "cuda" and not triton_interpreted():
            raise ValueError(
                f"kernel backend 'triton' on device '{device}' needs Triton's interpreter: set "
                "TRITON_INTERPRET=1 in the environment before importing this package (or use --kernel torch)")
        return TritonBackend(exact=exact)
    raise ValueError(f"kernel backend must be 'torch' or 'triton', got {name!r}")
