"""Choose, once per device, dtype and weight shape, the form of every matrix product
(models/linear.py) by measuring them, and cache the choice.

Each form is timed on the model's own weights of that shape, cycled through (as many as
make at least 48 MB, so the measurement reads them cold from memory as the forward does),
for every row bucket; the fastest wins (``skinny`` unless another form beats it by more than
SKINNY_MARGIN; at steps of up to STACK_ROWS rows a whole forward with every layer product
``skinny``, the stack then one C call, is timed against the per-product choice). The forms of
a bucket are timed in interleaved rounds and each keeps its fastest round: on a shared machine
one slow spell must not decide the table (a median of two calls once cached a form far slower
than the best for a one-row product). The table is cached as JSON under
``cache_dir/tune/`` keyed by the device, thread count, torch version, dtype, the shapes and
the memory policy; a corrupt or foreign cache file is ignored with a warning and measured
again. On a GPU the candidates are torch's own forms only, and ``linear`` (plain cuBLAS) is
one of them, so a choice is never slower than cuBLAS as measured.

Memory: the ``packed`` form needs a second copy of the weight (oneDNN's layout), so the whole
model's weights once more. ``extra_weight_memory``: "auto" allows it when the weights take at
most 2 GiB (the default model: +0.54 GB in fp32), "on" always, "off" never. The ``skinny``
form (kernels/skinny.py, x86 CPUs with a C compiler, fp32) reads the weight itself: no memory.
"""

import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

from models.linear import BUCKETS, EXACT_PLAN, STEP_ROWS, ProductPlan, pack, product
from models.machine import device_name, write_whole  # noqa: F401 -- also where callers found it

VERSION = 6  # of the measurement, raised whenever it changes: caches of another version are measured again
AUTO_LIMIT = 2 << 30  # bytes of weights up to which "auto" keeps packed copies
COLD_BYTES = 48 << 20  # weights cycled through per measurement (beyond the caches)
Timer = Callable[[Callable[[], object], int], float]  # (fn, reps) -> fastest seconds of reps calls
# at a decoding step's rows (<= STEP_ROWS) ``skinny`` is chosen unless another form is faster than
# it by more than this factor (prefill chunks: the fastest wins): its rows do
# not depend on the step (greedy tokens cannot flip with the step size), and when all four products
# of the layers are ``skinny`` at a step's rows the whole layer stack is one C call
# (kernels/cpu/skinny_layers.c), which saves the per-op dispatch: far more than a product 15%
# slower costs (docs/DESIGN.md, "The CPU kernels").
SKINNY_MARGIN = 1.15
# Step buckets (every one: up to STEP_ROWS rows) are also decided for the layer as a whole: a
# forward with every layer product ``skinny`` (then the stack is one C call) against one with
# the forms measured one by one, at STACK_CONTEXT keys; the faster wins. The per-product margin
# above cannot see that one slower product (the gate/up product, measured alone, where oneDNN
# won by more than the margin at 24-64 rows) costs every layer its dispatch savings.
STACK_ROWS = STEP_ROWS
STACK_CONTEXT = 256


def _timer(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _products(model) -> list[tuple[str, torch.Tensor, Optional[torch.Tensor], Callable[[ProductPlan], None]]]:
    """(name, weight, bias, set_plan) for every product of the forward with an fp32 weight, the
    LM head included; a quantized product (``Linear.quant``, ``head_quant``) has one form."""
    from models.linear import Linear

    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, Linear) and mod is not model.lm_head and mod.quant is None:
            out.append((name, mod.weight, mod.bias, lambda p, m=mod: setattr(m, "plan", p)))
    if getattr(model, "head_quant", None) is None:
        out.append(("head", model.head_weight, None, lambda p: setattr(model, "head_plan", p)))
    return out


def _shape_key(w: torch.Tensor, b: Optional[torch.Tensor]) -> str:
    return f"{w.shape[0]}x{w.shape[1]}{'+b' if b is not None else ''}"


def tune_model(model, cache_dir: Path | str, extra_weight_memory: str = "auto", reps: int = 5,
               timer: Timer = _timer, stack_timer: Optional[Timer] = None) -> dict[str, list[str]]:
    """Measure (or read from the cache) the form table of every weight shape and install it
    on ``model``; returns {shape: forms per bucket}. ``stack_timer`` times the whole-stack
    comparison (``_prefer_whole_stack``); None: the real clock when ``timer`` is the real one,
    else no comparison (a test's fake product timer cannot time forwards)."""
    if extra_weight_memory not in ("auto", "on", "off"):
        raise ValueError(f"extra_weight_memory must be 'auto', 'on' or 'off', got {extra_weight_memory!r}")
    if stack_timer is not None and not callable(stack_timer):
        raise ValueError(f"stack_timer must be None or a callable (fn, reps) -> seconds, got {stack_timer!r}")
    prods = _products(model)
    if not prods or model.backend.exact:  # every product quantized, or exact (one form, models/llama.py)
        return {}
    dev, dtype = model.device, model.dtype
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    packed_ok = (dev.type == "cpu" and torch.backends.mkldnn.is_available()
                 and (extra_weight_memory == "on" or (extra_weight_memory == "auto" and weight_bytes <= AUTO_LIMIT)))
    from kernels import skinny

    skinny_ok = dev.type == "cpu" and dtype == torch.float32 and skinny.available()
    forms = ["linear", "wxt"] + (["packed"] if packed_ok else []) + (["skinny"] if skinny_ok else [])
    shapes = sorted({_shape_key(w, b) for _, w, b, _ in prods})
    key = {"version": VERSION, "device": device_name(dev), "threads": torch.get_num_threads(),
           "torch": torch.__version__,
           "dtype": str(dtype), "shapes": shapes, "forms": forms, "buckets": list(BUCKETS)}
    if skinny_ok:
        key["skinny"] = skinny.build_tag()
    path = Path(cache_dir) / "tune" / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
                                       + ".json")
    tables = _read_cache(path, key)
    if stack_timer is None and timer is _timer:
        stack_timer = _timer
    if tables is None:
        tables = _measure(prods, forms, reps, timer, dev, dtype)
        if skinny_ok and stack_timer is not None:
            _install(prods, tables)
            _prefer_whole_stack(model, prods, tables, stack_timer)
        write_whole(path, json.dumps({"key": key, "tables": tables}, indent=1))
    elif skinny_ok and stack_timer is not None:
        # A cached table that keeps some layer product of a decoding step off the one-call stack
        # is timed against all-skinny again (only those buckets; a forward or two each): a table
        # tuned while other work shared the cores can hold a choice made by noise, which no
        # later run would notice (one kept one-token steps at twice their time).
        _install(prods, tables)
        before = json.dumps(tables, sort_keys=True)
        _prefer_whole_stack(model, prods, tables, stack_timer)
        if json.dumps(tables, sort_keys=True) != before:
            write_whole(path, json.dumps({"key": key, "tables": tables}, indent=1))
    _install(prods, tables)
    return tables


def _install(prods, tables) -> None:
    for _, w, b, set_plan in prods:
        table = tables[_shape_key(w, b)]
        set_plan(ProductPlan(list(table), pack(w) if "packed" in table else None))


@torch.inference_mode()
def _prefer_whole_stack(model, prods, tables: dict[str, list[str]], timer: Timer, reps: int = 3) -> None:
    """For each step bucket of at most STACK_ROWS rows where some layer product is not
    ``skinny``: time a forward of that many step rows (one sequence, a random tree, STACK_CONTEXT
    keys) as planned and with every layer product ``skinny``, in interleaved rounds, each
    keeping its fastest; where all-skinny is faster, write it into ``tables`` (the LM head keeps
    its own form: it is not in the stack). ``model``'s plans must be installed from ``tables``."""
    from models.cost import random_tree
    from models.runner import ModelRunner, StepInput

    shapes = {_shape_key(w, b) for name, w, b, _ in prods if name != "head"}
    plans = [m.plan for m in model.modules() if getattr(m, "plan", None) is not None]
    gen = torch.Generator().manual_seed(0)
    context = max(0, min(STACK_CONTEXT, model.cfg.max_position_embeddings - STACK_ROWS - 1))
    runner = ModelRunner(model, cache_tokens=context + 2 * STACK_ROWS, block_size=16)
    for i, m in enumerate(BUCKETS):
        if m > STACK_ROWS or all(tables[s][i] == "skinny" for s in shapes):
            continue
        depths, mask = random_tree(m, gen)
        step = StepInput(0, torch.randint(0, model.cfg.vocab_size, (m,), generator=gen).tolist(), depths,
                         None if m == 1 else mask)
        if runner.has_sequence(0):
            runner.free(0)
        runner.add_sequence(0)
        if context:
            runner.assume_context(0, context)
        tokens, meta, idx = runner.prepare([step])
        planned = {id(p): p.table[i] for p in plans}

        def forward(all_skinny: bool):
            for p in plans:
                p.table[i] = "skinny" if all_skinny else planned[id(p)]
            model(tokens, meta, runner.cache.k, runner.cache.v, idx)

        best = {False: float("inf"), True: float("inf")}
        forward(False)  # warm-up
        forward(True)
        for _ in range(reps):
            for choice in (False, True):
                best[choice] = min(best[choice], timer(lambda c=choice: forward(c), 1))
        for p in plans:
            p.table[i] = planned[id(p)]
        if best[True] <= best[False]:
            for s in shapes:
                tables[s][i] = "skinny"


def _read_cache(path: Path, key: dict) -> Optional[dict]:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        tables = data["tables"]
        if data["key"] != key:
            warnings.warn(f"tuning cache {path} was written for another setup ({data['key']}); measuring again")
            return None
        ok = set(key["shapes"]) == set(tables) and all(
            len(t) == len(BUCKETS) and set(t) <= set(key["forms"]) for t in tables.values())
        if not ok:
            raise ValueError("tables do not match the key")
        return tables
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"tuning cache {path} is unreadable ({e}); measuring again")
        return None


@torch.inference_mode()
def _measure(prods, forms, reps, timer, dev, dtype) -> dict[str, list[str]]:
    by_shape: dict[str, list] = {}
    for _, w, b, _ in prods:
        by_shape.setdefault(_shape_key(w, b), []).append((w, b))
    tables = {}
    for shape, group in by_shape.items():
        nbytes = group[0][0].numel() * group[0][0].element_size()
        group = group[:max(1, -(-COLD_BYTES // nbytes))] if len(group) * nbytes > COLD_BYTES else group
        plans = [ProductPlan(["packed"] * len(BUCKETS), pack(w)) if "packed" in forms else None for w, _ in group]
        table = []
        for m in BUCKETS:
            x = torch.randn(m, group[0][0].shape[1], device=dev, dtype=dtype)
            def sweep(form):
                for (w, b), plan in zip(group, plans):
                    product(x, w, b, plan, form)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)

            for form in forms:  # warm-up
                sweep(form)
            times = {form: float("inf") for form in forms}
            for _ in range(reps):  # interleaved rounds, each form's fastest kept
                for form in forms:
                    times[form] = min(times[form], timer(lambda form=form: sweep(form), 1))
            best = min(forms, key=lambda f: times[f])
            near = "skinny" in times and times["skinny"] <= SKINNY_MARGIN * times[best] and m <= STEP_ROWS
            table.append("skinny" if near else best)
        tables[shape] = table
    return tables


def describe(model) -> str:
    """One line: the forms the model's products use, per row bucket (e.g. for a benchmark's
    header), and why the skinny kernel is not offered where it is not."""
    from kernels import skinny

    plans = [p for p in (getattr(m, "plan", None) for m in model.modules()) if p is not None]
    if model.head_plan is not None:
        plans.append(model.head_plan)
    weights = getattr(model, "weights", "fp32")
    if weights != "fp32":  # one form: kernels/quant.py
        formats = sorted({m.quant.format for m in model.modules() if getattr(m, "quant", None) is not None})
        return (f"quantized weights ({weights}: layers {'/'.join(formats)}, LM head {model.head_quant.format}), "
                "every product kernels/quant.py's")
    if not plans:
        return "untuned (every product plain F.linear)"
    if all(p.table == EXACT_PLAN.table for p in plans):
        return "exact: every product and the LM head kernels/exact_linear.py's at every row count"
    parts = []
    for i, b in enumerate(BUCKETS):
        counts: dict[str, int] = {}
        for p in plans:
            counts[p.table[i]] = counts.get(p.table[i], 0) + 1
        parts.append(f"{b}: " + "/".join(f"{f}" + (f" x{n}" if len(counts) > 1 else "")
                                         for f, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    line = "forms by rows (products per form): " + ", ".join(parts)
    if model.device.type == "cpu" and not skinny.available():
        line += f"; skinny kernel not offered: {skinny.unavailable_reason()}"
    return line
