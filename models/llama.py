"""Llama / Mistral / Qwen2 forward over a paged KV cache, one file for the whole family.

The model's whole interface is ``forward(tokens, meta, k_cache, v_cache, logits_idx)``: a
packed step (see ``kernels/__init__`` for the layout) in, logits of the requested rows out.
It knows nothing about decoding methods; attention and KV writes go through the backend.
"""

import ctypes
import os
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from kernels import elementwise, kv_ops, quant, skinny
from kernels.backend import Backend, StepMeta
from kernels.exact_linear import exact_linear
from kernels.norm import rms_norm as fused_rms_norm
from kernels.torch_plan import StepPlan
from models.config import ModelConfig
from models.linear import EXACT_PLAN, Linear, ProductPlan, bucket, product

# Parameters, buffers and submodules (re)registered anywhere since import: the whole-stack path
# walks the layers for its weights only when this moved (the walk costs 0.25 ms, 1% of a step)
_registrations = 0


def _registered(module, name, value) -> None:
    global _registrations
    _registrations += 1


for _hook in (nn.modules.module.register_module_parameter_registration_hook,
              nn.modules.module.register_module_buffer_registration_hook,
              nn.modules.module.register_module_module_registration_hook):
    _hook(_registered)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """(head_dim // 2,) fp32 inverse frequencies, with Llama-3 / linear scaling applied."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_ctx = scaling.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        inv_freq = torch.where(medium, blended, scaled)
    return inv_freq


def _skinny_ok(x: torch.Tensor) -> bool:
    """Whether x (rows, n) goes to the skinny CPU kernels (kernels/skinny.py: x86, fp32, built)."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.is_contiguous() \
        and skinny.available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # one fused op, the same arithmetic as below
        if _skinny_ok(x) and weight.dtype == torch.float32 and weight.is_contiguous():
            return skinny.rms_norm_unchecked(x, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # Normalise in fp32 whatever the weights' dtype: bf16 variance loses too much.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_mul(gate_up: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """(T, 2I) gate and up fused -> silu(gate) * up (T, I). ``fused``: one Triton launch."""
    if fused:
        return elementwise.silu_mul(gate_up)
    if _skinny_ok(gate_up):
        return skinny.silu_mul_unchecked(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Full-width (T, 1, D) cos and signed sin for ``apply_rope``, once per forward."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, D/2) fp32 angles
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat([cos, cos], -1).to(dtype)[:, None, :], torch.cat([-sin, sin], -1).to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, D); cos / signed sin (T, 1, D) from ``rope_tables``. Rotates the two halves
    (the "NeoX" layout HF uses): [x1 cos - x2 sin, x2 cos + x1 sin], the same products HF forms."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], -1) * sin


def rope_qk(qkv: torch.Tensor, H: int, KV: int, D: int, cos: torch.Tensor, sin: torch.Tensor, fused: bool = False):
    """q (T, H, D) and k (T, KV, D) of the fused qkv rows (T, (H + 2 KV) D), rotated. In fp32 on
    CPU one C call rotates them in place (bit for bit ``apply_rope``); ``fused``: one Triton
    launch in place (the same roundings); else ``apply_rope``."""
    T = qkv.shape[0]
    if fused:
        elementwise.rope(qkv, cos.view(T, D), sin.view(T, D), H + KV, D)
        return qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + KV) * D].view(T, KV, D)
    if _skinny_ok(qkv) and D % 16 == 0 and cos.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous():
        skinny.rope_unchecked(qkv, cos.view(T, D), sin.view(T, D), H + KV)
        return qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + KV) * D].view(T, KV, D)
    qk = apply_rope(qkv[:, :(H + KV) * D].view(T, H + KV, D), cos, sin)  # q and k rotated at once
    return qk[:, :H], qk[:, H:]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.eps = cfg.rms_norm_eps
        self.attn_norm = nn.Parameter(torch.ones(d))
        # q, k, v fused into one matmul; Qwen2 adds a bias to all three.
        self.wqkv = Linear(d, (cfg.num_heads + 2 * cfg.num_kv_heads) * hd, bias=cfg.qkv_bias)
        self.wo = Linear(cfg.num_heads * hd, d, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.w_gate_up = Linear(d, 2 * cfg.intermediate_size, bias=False)  # gate and up fused
        self.w_down = Linear(cfg.intermediate_size, d, bias=False)

    def forward(self, h, cos, sin, meta: StepMeta, k_cache, v_cache, backend: Backend, window, plan=None):
        if backend.exact:
            return self._exact(h, cos, sin, meta, k_cache, v_cache, backend, window, plan)
        T = h.shape[0]  # h: (T, d)
        fused = backend.fused_ops  # one launch per norm (the residual add with the second), RoPE, silu * up
        qkv = self.wqkv(fused_rms_norm(h, self.attn_norm, self.eps) if fused else rms_norm(h, self.attn_norm, self.eps))
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        q, k = rope_qk(qkv, H, KV, D, cos, sin, fused)  # (T, H, D), (T, KV, D)
        v = qkv[:, (H + KV) * D:].view(T, KV, D)
        backend.kv_store(k_cache, v_cache, k, v, meta.slot_mapping, plan)
        o = backend.attention(q, k_cache, v_cache, meta, D**-0.5, window, plan)
        if fused:
            h, x = fused_rms_norm(h, self.mlp_norm, self.eps, residual=self.wo(o.reshape(T, -1)))
        else:
            h = h + self.wo(o.reshape(T, -1))
            x = rms_norm(h, self.mlp_norm, self.eps)
        return h + self.w_down(silu_mul(self.w_gate_up(x), fused))

    def _exact(self, h, cos, sin, meta: StepMeta, k_cache, v_cache, backend: Backend, window, plan):
        """The layer on the exact path: each RMSNorm in its product's prologue, silu * up in the down
        projection's, the residual adds in the epilogues of the attention's output and the down
        projection, RoPE with the K/V store (kernels/exact_linear.py, kernels/kv_ops.py ``rope_store``):
        6 launches with the attention's, where the forward above makes 11, every row still computed as
        in a step of its own. Why: on a GPU a small model's forward is bound by its launches, not its
        bytes (issue 53; docs/DESIGN.md, "The exact path")."""
        T, H, KV, D = h.shape[0], self.n_heads, self.n_kv, self.head_dim
        qkv = exact_linear(h, self.wqkv.weight, self.wqkv.bias, norm=self.attn_norm, eps=self.eps)
        # the cache is in the model's dtype: kv_cache_dtype refuses another on the Triton backend
        kv_ops.rope_store(qkv, cos.view(T, D), sin.view(T, D), H, KV, k_cache, v_cache, meta.slot_mapping)
        o = backend.attention(qkv[:, :H * D].view(T, H, D), k_cache, v_cache, meta, D**-0.5, window, plan)
        h = exact_linear(o.reshape(T, -1), self.wo.weight, self.wo.bias, residual=h)
        x = exact_linear(h, self.w_gate_up.weight, self.w_gate_up.bias, norm=self.mlp_norm, eps=self.eps)
        return exact_linear(x, self.w_down.weight, self.w_down.bias, silu=True, residual=h)


class Transformer(nn.Module):
    # CUDA-graph replay of decoding steps (models/graphs.py: use_cuda_graphs): its options, and
    # the runner ModelRunner.for_batch hands out again; None = off
    step_graphs: Optional[dict] = None
    shared_runner = None
    # a step-cost curve every ModelRunner.forward of this model is padded to (models.cost.Emulation,
    # set by models.cost.emulate_step_cost); None = the machine's own speed. Declared here, like
    # the graphs' options: per-model run-time settings the runner reads, not hidden state
    emulated_cost = None
    # the weights' form (models/loader.py ``weights``): "fp32", or "q8_0" / "native" for products
    # with block-quantized weights (each Linear's ``quant``, the LM head's ``head_quant``)
    weights = "fp32"
    head_quant: Optional[quant.QuantWeight] = None
    kv_dtype: Optional[torch.dtype] = None  # the KV cache's dtype where set; None: kv_cache_dtype() chooses

    def __init__(self, cfg: ModelConfig, backend: Backend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        # On the meta device, where every load builds the model (and sets the numbers after), an
        # op runs torch's Python reference, whose first use imports torch._dynamo: about 1 s of a
        # 5 s command-line answer (bench/results/2026-11-28-cpu-side-off/cli_time.txt). So the
        # embedding's init (nn.Embedding's normal_) and the rotary frequencies are computed only on
        # a device that holds numbers.
        meta = torch.empty(0).device.type == "meta"
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if not meta:
            nn.init.normal_(weight)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", torch.empty(cfg.head_dim // 2) if meta else rope_inv_freq(cfg),
                             persistent=False)
        self.head_plan: Optional[ProductPlan] = None  # the LM head's product plan (models/tune.py)
        if backend.exact:  # the exact path: every product in kernels/exact_linear.py, never tuned
            for m in self.modules():
                if isinstance(m, Linear):
                    m.plan = EXACT_PLAN
            self.head_plan = EXACT_PLAN

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def forward(
        self,
        tokens: torch.Tensor,  # (T_total,) int64
        meta: StepMeta,
        k_cache: torch.Tensor,  # (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
        v_cache: torch.Tensor,
        logits_idx: Optional[torch.Tensor] = None,  # (R,) rows of the step that need logits; None = all
        hidden: bool = False,  # return the final norm's rows (R, hidden), not the logits (``head`` makes them)
    ) -> torch.Tensor:  # (R, vocab) fp32
        window = self.cfg.sliding_window
        plan = self.backend.plan(meta, k_cache.shape[2], window)  # what all layers share, once
        # RoPE angles in fp32 from explicit positions (tree / window tokens share positions): a
        # table of every position where the step is planned on the CPU in fp32
        table = self._rope_table(plan, self.embed.weight.dtype, meta.positions)
        out = self._whole_stack(tokens, meta, plan, k_cache, v_cache, table, logits_idx)
        if out is None:
            h = self.embed(tokens)
            if table is not None:
                cos, sin = table[:, meta.positions.long()]
            else:
                cos, sin = rope_tables(meta.positions, self.inv_freq, h.dtype)
            for i, layer in enumerate(self.layers):
                h = layer(h, cos, sin, meta, k_cache[i], v_cache[i], self.backend, window, plan)
            if self.backend.exact and not hidden and self.head_quant is None:  # the final norm in the head's prologue
                return exact_linear(h if logits_idx is None else h[logits_idx], self.head_weight, None,
                                    out_dtype=torch.float32, norm=self.norm, eps=self.cfg.rms_norm_eps)
            out = self._final_norm(h, logits_idx)
        return out if hidden else self.head(out)

    def _final_norm(self, h: torch.Tensor, logits_idx: Optional[torch.Tensor]) -> torch.Tensor:
        """The final norm of the rows ``logits_idx`` of h (None: every row)."""
        if logits_idx is not None:
            h = h[logits_idx]
        eps = self.cfg.rms_norm_eps
        return fused_rms_norm(h, self.norm, eps) if self.backend.fused_ops else rms_norm(h, self.norm, eps)

    def _rope_table(self, plan, dtype: torch.dtype, positions: torch.Tensor) -> Optional[torch.Tensor]:
        """Where the torch backend planned the step on the CPU in fp32: (2, n, 1, D) cos and signed
        sin of every position below n (at least the step's longest sequence), made by
        ``rope_tables`` itself (a few hundred positions a call, grown by doubling) and kept; the
        one-call stack reads each row's by its position, the per-op path indexes it. Making the
        rows each step took some ten ops (0.07 ms of a one-token step). A position gets the same
        angles in every step whatever the step's size, as it does from ``rope_tables`` where a
        row's angles fill whole vectors. None elsewhere: ``rope_tables`` of the positions."""
        if not (isinstance(plan, StepPlan) and plan.seqs and dtype == torch.float32 and positions.device.type == "cpu"):
            return None
        need = max(sp.length for sp in plan.seqs)  # every position of a sequence's step is below its length
        tab = self.__dict__.get("_rope_cache")
        if tab is None or tab[1].shape[1] < need or tab[0] != self.inv_freq.data_ptr():
            have = 0 if tab is None or tab[0] != self.inv_freq.data_ptr() else tab[1].shape[1]
            n = max(need, 2 * have, 256)
            parts = [torch.stack(rope_tables(torch.arange(a, min(a + 256, n), dtype=torch.int32), self.inv_freq, dtype))
                     for a in range(0, n, 256)]
            tab = self.__dict__["_rope_cache"] = (self.inv_freq.data_ptr(), torch.cat(parts, 1))
        return tab[1]

    def kv_cache_dtype(self) -> torch.dtype:
        """The dtype a runner's KV cache takes: ``kv_dtype`` where set; fp16 on a CPU where the
        products are block-quantized (``weights`` native or q8_0: their forwards read the weights
        in a quarter of fp32's bytes, so the cache's bytes count) and the torch backend's C kernels
        read fp16 caches; else the model's dtype (the Triton kernels read the rows' dtype;
        ``--weights fp32`` keeps fp32 K/V, to compare with transformers number for number). Every
        method reads the same rounded K/V, so greedy outputs stay ``ar``'s."""
        if self.kv_dtype is not None:
            if self.kv_dtype != self.dtype and (self.device.type != "cpu" or self.backend.name != "torch"
                                                or self.kv_dtype not in skinny.KV_DTYPES):
                raise ValueError(f"kv_dtype must be the model's dtype ({self.dtype}) or, on a CPU with the torch "
                                 f"backend, one of {', '.join(map(str, skinny.KV_DTYPES))}; got {self.kv_dtype}")
            return self.kv_dtype
        if (self.head_quant is not None and self.device.type == "cpu" and self.dtype == torch.float32
                and self.backend.name == "torch" and skinny.kv16_available()):
            return torch.float16
        return self.dtype

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The logits (R, vocab) fp32 of the final norm's rows h (R, hidden)."""
        if self.head_quant is not None:
            return quant.quant_linear(h, self.head_quant)
        if self.head_plan is EXACT_PLAN:  # fp32 logits from the fp32 sums, not rounded to 16 bits first
            return exact_linear(h, self.head_weight, None, out_dtype=torch.float32)
        return product(h, self.head_weight, None, self.head_plan).float()

    def head_screen(self) -> Optional[skinny.HeadScreen]:
        """The LM head's bf16 screen (kernels/skinny.py ``head_topk``: the greedy top-k of the
        logits without computing them) where the active CPU build has one and the head is fp32
        on the CPU; built on first use and again after the weight changed. None elsewhere (a
        quantized head and the exact path among them: greedy steps take the argmax of its logits), or with
        ``SPECDEC_HEAD_SCREEN=0``."""
        if self.head_quant is not None:  # first: the CPU default's answer, asked every greedy step
            return None
        w = self.head_weight
        if (os.environ.get("SPECDEC_HEAD_SCREEN", "1") == "0" or self.backend.exact
                or w.device.type != "cpu" or w.dtype != torch.float32
                or not w.is_contiguous() or not skinny.head_available()):
            return None
        screen = self.__dict__.get("_head_screen")
        if screen is None or screen.stale() or screen.weight.data_ptr() != w.data_ptr():
            screen = self.__dict__["_head_screen"] = skinny.HeadScreen(w)
        return screen

    def _whole_stack(self, tokens: torch.Tensor, meta: StepMeta, plan, k_cache, v_cache,
                     table: Optional[torch.Tensor], logits_idx: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Every layer in one C call (kernels/cpu/skinny_layers.c: the same kernels in the same
        order as ``Block.forward``, bit for bit) when each piece of the step would go to the skinny
        CPU kernels anyway: fp32 on x86, the torch backend's plan with the C attention for every
        sequence, every product planned ``skinny`` at this step's rows or quantized (one form).
        The tokens' embedding rows are gathered in the same call (``self.embed`` took some 40 us a
        step in the decoding loop, its Python and dispatch cold after a forward). Returns the final
        norm's rows of ``logits_idx`` (None: every row), normed in the same call where the norm's
        weight and the rows' index take it; None: nothing was done, use the per-op path."""
        cfg = self.cfg
        emb = self.embed.weight
        if not (isinstance(plan, StepPlan) and table is not None
                and emb.dtype == torch.float32 and emb.device.type == "cpu" and emb.is_contiguous()
                and skinny.available() and tokens.dtype == torch.int64 and tokens.dim() == 1
                and tokens.is_contiguous() and tokens.device.type == "cpu"
                and (k_cache.dtype == torch.float32 or (k_cache.dtype == torch.float16 and skinny.kv16_available()))
                and k_cache.is_contiguous() and v_cache.is_contiguous()
                and meta.positions.dtype == torch.int32 and meta.positions.is_contiguous()
                and cfg.head_dim % 16 == 0 and cfg.num_heads // cfg.num_kv_heads <= skinny.MAX_GROUP):
            return None
        if any(sp.block_ids is None or sp.causal for sp in plan.seqs):
            return None
        T = tokens.shape[0]
        b = bucket(T)
        plain, tensors, fmts, checked = self._stack_parts()
        for lin in plain:
            if lin.plan is None or lin.plan.table[b] != "skinny":
                return None
        ptrs = self._layer_ptrs(tensors, fmts, checked, k_cache, v_cache)
        seqs = plan.seqs
        # the per-sequence arrays as ctypes arrays: a step's few numbers, no torch op (each costs
        # microseconds of a one-token step)
        seq_start = (ctypes.c_int32 * (len(seqs) + 1))(*[sp.start for sp in seqs], seqs[-1].end)
        seq_len = (ctypes.c_int64 * len(seqs))(*[sp.length for sp in seqs])
        blocks = (ctypes.c_void_p * len(seqs))(*[sp.block_ids.data_ptr() for sp in seqs])
        masks = (ctypes.c_void_p * len(seqs))(*[None if sp.tail_causal or sp.mask is None else sp.mask.data_ptr()
                                                for sp in seqs])
        causal = (ctypes.c_uint8 * len(seqs))(*[sp.tail_causal for sp in seqs])
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        step = skinny.StepArgs(T, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                               cfg.intermediate_size, len(seqs), k_cache.shape[2], torch.get_num_threads(),
                               cfg.rms_norm_eps, cfg.head_dim ** -0.5, table[0].data_ptr(), table[1].data_ptr(),
                               slots.data_ptr(), ctypes.addressof(seq_start), ctypes.addressof(seq_len),
                               ctypes.addressof(blocks), ctypes.addressof(masks), int(k_cache.dtype == torch.float16),
                               meta.positions.data_ptr())
        step.seq_causal, step.tokens, step.embed, step.vocab = (ctypes.addressof(causal), tokens.data_ptr(),
                                                                emb.data_ptr(), emb.shape[0])
        h = torch.empty(T, cfg.hidden_size)
        # the final norm in the same call (skinny_rms_norm, as ``rms_norm`` takes it), where it can
        norm, out = self.norm, None
        if (norm.dtype == torch.float32 and norm.is_contiguous() and not self.backend.fused_ops
                and (logits_idx is None or (logits_idx.dtype == torch.int64 and logits_idx.is_contiguous()
                                            and logits_idx.device.type == "cpu"))):
            out = torch.empty(T if logits_idx is None else logits_idx.shape[0], cfg.hidden_size)
            step.final_norm, step.n_out, step.out = norm.data_ptr(), out.shape[0], out.data_ptr()
            step.out_rows = None if logits_idx is None else logits_idx.data_ptr()
        kv_token = len(self.layers) * 2 * cfg.num_kv_heads * cfg.head_dim * k_cache.element_size()
        step.side = skinny.side_stream(self._step_weight_bytes(tensors) + kv_token * sum(sp.length for sp in seqs))
        skinny.layers_unchecked(h, ptrs, len(self.layers), step)
        return out if out is not None else self._final_norm(h, logits_idx)

    def _stack_parts(self) -> tuple[list, list, list, list]:
        """Every layer's products without a quantized weight, the weights ``skinny.LayerPtrs`` takes
        in its order, the products' formats, and which of those weights a step checks for a new
        pointer (``_layer_ptrs``); walked again only after a parameter, buffer or module was
        registered somewhere."""
        parts = self.__dict__.get("_parts")
        if parts is None or parts[0] != _registrations:
            lins, tensors, fmts = [], [], []

            def w(lin):  # a quantized product's packed panels, else its fp32 weight
                return lin.weight if lin.quant is None else lin.quant.data

            for layer in self.layers:
                prods = [layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down]
                lins += prods
                tensors += [layer.attn_norm, w(layer.wqkv), layer.wqkv.bias, w(layer.wo), layer.mlp_norm,
                            w(layer.w_gate_up), w(layer.w_down)]
                fmts.append([0 if lin.quant is None else quant.FORMATS[lin.quant.format] for lin in prods])
            # the products without a quantized weight: the only ones whose plan a step checks
            # (a quantized one has one form; ``Linear.quantize`` registers, so this is walked again)
            plain = [lin for lin in lins if lin.quant is None]
            # a parameter's memory may be replaced without a registration (``.data =``, ``.to()``):
            # its pointer is checked every step; a quantized product's packed bytes are a buffer of
            # its own that only ``Linear.quantize`` (registered) replaces, not checked (asking 200
            # tensors for their pointers took 0.13 ms a step after a forward, 4% of a one-token step)
            packed = {id(lin.quant.data) for lin in lins if lin.quant is not None}
            checked = [i for i, t in enumerate(tensors) if t is not None and id(t) not in packed]
            parts = self.__dict__["_parts"] = (_registrations, plain, tensors, fmts, checked)
        return parts[1], parts[2], parts[3], parts[4]

    def _step_weight_bytes(self, tensors: list) -> int:
        """The bytes of weights a step streams: the layers' (``_stack_parts``' tensors) and the LM
        head's; counted again after a registration."""
        cached = self.__dict__.get("_weight_bytes")
        if cached is None or cached[0] != _registrations:
            head = self.head_quant.data if self.head_quant is not None else self.head_weight
            total = sum(t.nbytes for t in tensors if t is not None) + head.nbytes
            cached = self.__dict__["_weight_bytes"] = (_registrations, total)
        return cached[1]

    def _layer_ptrs(self, weights: list, fmts: list, checked: list, k_cache, v_cache):
        """The ctypes array of every layer's weight and cache pointers, rebuilt when one of the
        ``checked`` weights or the cache moved, or after a registration."""
        # the cache's shape too: a new cache at a freed one's address may hold another number of blocks
        key = (_registrations, k_cache.data_ptr(), v_cache.data_ptr(), *k_cache.shape, *v_cache.shape,
               *[weights[i].data_ptr() for i in checked])
        cached = getattr(self, "_ptrs_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        kb, vb, per = k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0) * k_cache.element_size()
        ptrs = [0 if t is None else t.data_ptr() for t in weights]
        arr = (skinny.LayerPtrs * len(self.layers))()
        for i, layer in enumerate(self.layers):
            w = ptrs[7 * i: 7 * i + 7]
            arr[i] = skinny.LayerPtrs(*[p or None for p in w], kb + i * per, vb + i * per,
                                      (ctypes.c_int32 * 4)(*fmts[i]))
        self._ptrs_cache = (key, arr)
        return arr

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load weights named as in Hugging Face ``LlamaForCausalLM`` (q/k in HF's rotary layout)."""
        sd = {k.removeprefix("model."): v for k, v in sd.items()}
        cfg = self.cfg

        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise ValueError(f"the checkpoint has no tensor model.{name}: a {cfg.architecture} of "
                                 f"{cfg.num_layers} layers needs it (a truncated or partial checkpoint, or one of "
                                 "another architecture than its config says?)")
            return sd.pop(name)

        own = {"embed.weight": take("embed_tokens.weight"), "norm": take("norm.weight")}
        if self.lm_head is not None:
            own["lm_head.weight"] = take("lm_head.weight")
        else:
            sd.pop("lm_head.weight", None)
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            a = p + "self_attn."
            own[p + "attn_norm"] = take(p + "input_layernorm.weight")
            own[p + "mlp_norm"] = take(p + "post_attention_layernorm.weight")
            own[p + "wqkv.weight"] = torch.cat([take(a + f"{x}_proj.weight") for x in "qkv"])
            if cfg.qkv_bias:
                own[p + "wqkv.bias"] = torch.cat([take(a + f"{x}_proj.bias") for x in "qkv"])
            own[p + "wo.weight"] = take(a + "o_proj.weight")
            own[p + "w_gate_up.weight"] = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
            own[p + "w_down.weight"] = take(p + "mlp.down_proj.weight")
        leftover = [k for k in sd if not k.endswith("rotary_emb.inv_freq")]
        if leftover:
            raise ValueError(f"unexpected weights in checkpoint: {leftover[:5]}{' ...' if len(leftover) > 5 else ''}")
        try:  # assign=True: the model may have been built on the meta device
            missing, unexpected = self.load_state_dict(own, strict=False, assign=True)
        except RuntimeError as e:  # shape mismatches
            raise ValueError(f"weights do not fit the config: {e}") from e
        missing = [m for m in missing if m != "inv_freq"]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
