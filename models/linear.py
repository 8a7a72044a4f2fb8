"""Matrix products issued in the form that is fastest for the weight's shape and the step's
rows on this device.

``x @ W.T`` can be issued several ways, and which is fastest depends on M (rows) and the
device's BLAS: on a CPU ``F.linear`` takes a slow GEMV path at M = 1, ``(W @ x.T).T`` avoids it,
and oneDNN with a pre-packed weight wins from several rows on (docs/DESIGN.md, "The CPU
kernels"). So nothing is assumed: ``models/tune.py`` measures the forms once per device, dtype
and shape and fills each weight's ``ProductPlan``; untuned, every product is plain ``F.linear``.

Forms:
  * ``linear``  F.linear(x, W, b) (cuBLAS / MKL as torch chooses); always a candidate.
  * ``wxt``     (W @ x.T).T: the weight as the left operand; at M = 1 x is padded to 2 rows
                (the single-column product falls back to the slow GEMV).
  * ``packed``  oneDNN's linear on a copy of W packed for it (CPU only): costs a second copy of
                the weight, so models/tune.py offers it only within a memory budget.
  * ``skinny``  kernels/skinny.py: a hand-written AVX2 / AVX-512 kernel for few rows on W itself (x86 CPU,
                fp32, built with the system C compiler; offered only where it builds). A row's
                result does not depend on the step's rows.
  * ``exact``   kernels/exact_linear.py: a Triton kernel with one tile and one K order for every
                row count, so a row's result does not depend on the step's rows on a GPU either.
                Not measured against the others: the exact path (``TritonBackend(exact=True)``)
                gives it to every product at every row count (``EXACT_PLAN``), and nothing else does.

A ``Linear`` given a block-quantized weight (``Linear.quantize``: Q4_1 / Q8_0 for the x86 CPU
kernels of kernels/quant.py, models/loader.py's ``weights``) has one form, that kernel: its fp32
weight is dropped (left on the meta device, for its shape) and nothing tunes it.
"""

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from kernels.exact_linear import exact_linear
from kernels.quant import QuantWeight, quant_linear
from kernels.skinny import skinny_linear

# row counts a table has a form for (more: the last); 256 stands for prefill chunks, where the
# large-GEMM forms win and a decoding step's choice must not be reused
BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 256)
STEP_ROWS = 64  # buckets up to this many rows are decoding steps
FORMS = ("linear", "wxt", "packed", "skinny", "exact")


def bucket(m: int) -> int:
    """Index of the smallest bucket holding ``m`` rows (the last for anything larger)."""
    for i, b in enumerate(BUCKETS):
        if m <= b:
            return i
    return len(BUCKETS) - 1


@dataclass
class ProductPlan:
    """How to issue ``x @ W.T`` for one weight: a form per row bucket, and the packed copy of
    W when some bucket uses it (a plain attribute: not a parameter, not in the state dict)."""

    table: list[str]  # len(BUCKETS) forms
    packed: Optional[torch.Tensor] = field(default=None, repr=False)


# every row count in the exact kernel: the exact path's plan for every product
EXACT_PLAN = ProductPlan(["exact"] * len(BUCKETS))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed copy of ``weight`` (out, in) for ``form="packed"``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Optional[ProductPlan],
            form: Optional[str] = None) -> torch.Tensor:
    """x (M, in) @ weight (out, in).T + bias -> (M, out), contiguous, in the planned form
    (``form`` overrides the plan: the tuner measures with it)."""
    if form is None:
        form = "linear" if plan is None else plan.table[bucket(x.shape[0])]
    if form == "linear":
        return F.linear(x, weight, bias)
    if form == "wxt":
        m = x.shape[0]
        xt = x.t() if m > 1 else torch.cat([x, x]).t()  # (in, max(M, 2))
        y = (weight @ xt).t()[:m].contiguous()
        return y.add_(bias) if bias is not None else y
    if form == "packed":
        return torch.ops.mkldnn._linear_pointwise(x, plan.packed, bias, "none", [], "")
    if form == "skinny":
        return skinny_linear(x.contiguous(), weight, bias)
    if form == "exact":
        return exact_linear(x, weight, bias)
    raise ValueError(f"unknown product form {form!r}; known: {', '.join(FORMS)}")


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose product follows ``self.plan``, or
    with a quantized weight (``quant``) kernels/quant.py's product."""

    plan: Optional[ProductPlan] = None
    quant: Optional[QuantWeight] = None

    def quantize(self, weight: QuantWeight) -> None:
        """Multiply by ``weight`` (this product's weight, packed) from now on; the fp32 weight is
        dropped (a meta tensor keeps its shape) and the plan with it."""
        if weight.shape != tuple(self.weight.shape):
            raise ValueError(f"weight must be {tuple(self.weight.shape)} (out, in), got {weight.shape}")
        self.quant, self.plan = weight, None
        # registered, so models/llama.py's whole-stack path sees the change and walks the layers again
        self.register_buffer("qdata", weight.data, persistent=False)
        self.weight = nn.Parameter(torch.empty(self.weight.shape, device="meta"), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return quant_linear(x, self.quant, self.bias)
        return product(x, self.weight, self.bias, self.plan)
