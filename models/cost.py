"""The device's cost of a step: predicted forward time (ms) as a function of the step tokens
of each sequence, measured once on the device and cached. The step planner
(decoding/planner.py) sizes every step with it.

Measured at start-up in a few seconds: a step of T tokens (a random draft tree's mask, as
speculative methods send) for T in ``GRID`` at batch 1 over a ``context``-token prefix, and
one-token steps at batch 2, 4 and 8 for the per-sequence cost (attention, packing), and a
coarse curve (``LONG_GRID``) over a 4x longer prefix for what attention adds per committed
token. The prediction interpolates the batch-1 curve at the batch's total tokens (made
non-decreasing), adds the per-sequence cost for each sequence past the first and, when the
sequences' committed lengths are given, each sequence's attention cost for its own length
(linear in the length, from the two curves at its own step tokens). The cache file lives under
``cache_dir/cost/``; one that is corrupt or was written for another device, model, dtype,
kernel backend or product table is ignored with a warning and measured again.

A cached curve is also checked against the machine as it is now, in a fraction of a second:
steps of ``CHECK_TOKENS`` tokens are timed (fastest of a few rounds) and when a one-token step
or the 16-token / one-token ratio is off the cached curve by more than ``CHECK_TOLERANCE``
(a shared machine that got slower, another process on the cores, a cache carried to another
host of the same name), the curve is measured again with a warning. ``StepCost.origin`` says
which of these happened.

A curve can also be saved (``save_step_cost``: every benchmark run writes the one it planned
with) and pinned in a later run (``load_step_cost``; ``--step-cost FILE``), which with the
planner's ``learn_overhead=False`` (``--fixed-plan``) makes every planned step, and so tau, the
same from run to run.
"""

import bisect
import copy
import hashlib
import json
import math
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

import torch

from kernels import skinny
from models.machine import device_name, write_whole

GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
LONG_GRID = (1, 4, 16, 64)
BATCHES = (2, 4, 8)
VERSION = 3  # of the cache's content, raised whenever it changes: older caches are measured again
CHECK_TOKENS = (1, 16)  # step tokens timed to check a cached curve against the machine
CHECK_TOLERANCE = 0.25  # relative drift (either way) past which a cached curve is measured again


@dataclass
class StepCost:
    tokens: list[int]  # step tokens at batch 1 (GRID)
    ms: list[float]  # their forward time, non-decreasing
    per_seq_ms: float  # each sequence past the first
    context: int  # committed tokens per sequence when measured
    long_context: int = 0  # a longer prefix (0: not measured)
    long_tokens: list[int] = field(default_factory=list)  # step tokens measured at long_context
    long_ms: list[float] = field(default_factory=list)  # their forward time there

    def __post_init__(self):
        # the planner asks for the same few values thousands of times per step: memoised per
        # step-token count (plain attributes, not fields: not in asdict / the cache file)
        self._curve_memo: dict[int, float] = {}
        self._slope_memo: dict[int, float] = {}
        self.origin = "given"  # step_cost sets: "measured", "cache (checked: ...)", "measured again (...)"

    def __call__(self, step_tokens: list[int], contexts: Optional[list[int]] = None) -> float:
        """Predicted ms of a forward whose sequences send ``step_tokens`` tokens each, over
        ``contexts`` committed tokens each (None: the measured ``context``)."""
        ms = self.curve(sum(step_tokens)) + self.per_seq_ms * max(0, len(step_tokens) - 1)
        if contexts is not None and self.long_context > self.context:
            span = self.long_context - self.context
            for t, c in zip(step_tokens, contexts):
                ms += self.attention_slope(t) * (c - self.context) / span
        return max(ms, 0.5 * self.ms[0])

    def attention_slope(self, t: int) -> float:
        """What ``long_context - context`` more committed tokens add to a step of ``t`` tokens."""
        out = self._slope_memo.get(t)
        if out is None:
            long = self._interp(self.long_tokens, self.long_ms, t)
            out = max(0.0, long - self._interp(self.long_tokens, [self.curve(x) for x in self.long_tokens], t))
            self._slope_memo[t] = out
        return out

    def curve(self, total: int) -> float:
        out = self._curve_memo.get(total)
        if out is None:
            out = self._curve_memo[total] = self._interp(self.tokens, self.ms, total)
        return out

    @staticmethod
    def _interp(ts: list[int], ms: list[float], total: int) -> float:
        if total <= ts[0]:
            return ms[0]
        if total >= ts[-1]:  # beyond the grid: the last segment's slope
            slope = (ms[-1] - ms[-2]) / (ts[-1] - ts[-2])
            return ms[-1] + slope * (total - ts[-1])
        j = bisect.bisect_left(ts, total)
        if ts[j] == total:
            return ms[j]
        a, b = ts[j - 1], ts[j]
        return ms[j - 1] + (ms[j] - ms[j - 1]) * (total - a) / (b - a)

    def relative(self, tokens: int) -> float:
        """A step of ``tokens`` tokens (batch 1) relative to a one-token step."""
        return self([tokens]) / self([1])


@dataclass
class Emulation:
    """A slower device's step-cost curve played on this one: every forward of at most
    ``max_tokens`` step tokens in total is padded (the host sleeps) until it has taken
    ``scale`` x the time ``cost`` predicts for it (its sequences' step tokens and committed
    lengths); larger steps (a long prompt's prefill) run as they are. Sleeping can only add
    time: where this machine is slower than the emulated curve, a step is not padded
    (``short_steps`` counts them), so emulate a curve slower than the machine. Set on a model
    with ``emulate_step_cost``; every ``ModelRunner.forward`` of the model honours it, the
    step-cost measurement included, so a planner plans with the emulated curve. For studying
    planning under another machine's cost shape (this CPU in another of its states, a device
    where wide steps cost more)."""

    cost: StepCost
    scale: float = 1.0  # the curve's ms are multiplied by this
    source: str = ""  # where the curve came from (a file), for reports
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)  # seconds; tests pass a fake
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    steps: int = 0  # forwards seen
    padded: int = 0  # of them padded
    short_steps: int = 0  # took longer than the emulated time already
    large_steps: int = 0  # above max_tokens: not emulated
    padded_ms: float = 0.0  # slept in all

    def __post_init__(self):
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")

    @property
    def max_tokens(self) -> int:
        return self.cost.tokens[-1]

    def key(self) -> str:
        """Of the curve and the scale: part of the step-cost cache's key."""
        return hashlib.sha256(json.dumps([asdict(self.cost), self.scale], sort_keys=True).encode()).hexdigest()[:16]

    def target_ms(self, step_tokens: list[int], contexts: Optional[list[int]] = None) -> Optional[float]:
        """The emulated time of a forward (None: too large to emulate)."""
        if sum(step_tokens) > self.max_tokens:
            return None
        return self.scale * self.cost(step_tokens, contexts)

    def pad(self, start: float, step_tokens: list[int], contexts: Optional[list[int]] = None) -> float:
        """Sleep until the forward that began at ``start`` (``clock()``) has taken its emulated
        time; returns the ms slept."""
        self.steps += 1
        target = self.target_ms(step_tokens, contexts)
        if target is None:
            self.large_steps += 1
            return 0.0
        left = target - (self.clock() - start) * 1e3
        if left <= 0:
            self.short_steps += 1
            return 0.0
        self.sleep(left / 1e3)
        self.padded += 1
        self.padded_ms += left
        return left

    def reset(self) -> None:
        """Zero the counters (after the step-cost measurement, say)."""
        self.steps = self.padded = self.short_steps = self.large_steps = 0
        self.padded_ms = 0.0

    def describe(self) -> str:
        c = self.cost
        return (f"{self.source or 'a given curve'}{f' x {self.scale:g}' if self.scale != 1 else ''}: forwards of at "
                f"most {self.max_tokens} step tokens padded (sleep) to 1 token {self.scale * c([1]):.1f} ms, "
                f"8 tokens {self.scale * c([8]):.1f}, "
                f"16 tokens {self.scale * c([16]):.1f} ({c.relative(16):.2f}x), 64 tokens "
                f"{self.scale * c([64]):.1f}; larger steps (prefills) as they are")

    def stats(self) -> str:
        return (f"{self.steps} forwards: {self.padded} padded (+{self.padded_ms / 1e3:.1f} s), {self.short_steps} "
                f"slower than emulated, {self.large_steps} above {self.max_tokens} tokens")


def emulate_step_cost(model, cost: Optional[StepCost], scale: float = 1.0, source: str = "") -> Optional[Emulation]:
    """Make ``model``'s forwards take ``scale`` x the time ``cost`` predicts (``Emulation``),
    or stop (``cost`` None). With a curve slower than this machine at every step size (the
    default model's steep-state curve, ``bench/data/step_cost_steep.json``, is: its one-token
    step is 24 ms where this CPU takes 15-20), every emulated forward takes the curve's time
    whatever state the machine is in, so the forward's cost is the same from run to run and
    only the host's work varies; ``Emulation.short_steps`` counts the forwards where it was not."""
    model.emulated_cost = None
    if cost is None:
        return None
    em = Emulation(cost, scale, source)
    model.emulated_cost = em
    return em


def _key(model, context: int) -> dict:
    cfg = model.cfg
    plans = [getattr(m, "plan", None) for m in model.modules()] + [model.head_plan]
    tables = json.dumps([p.table for p in plans if p is not None])
    return {"version": VERSION, "device": device_name(model.device), "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "dtype": str(model.dtype), "backend": model.backend.name, "context": context,
            "cuda_graphs": getattr(model, "step_graphs", None) is not None,
            # an emulated curve (Emulation): its forwards are padded, so is the curve measured
            "emulated": em.key() if (em := model.emulated_cost) is not None else None,
            "shape": [cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
                      cfg.num_kv_heads, cfg.head_dim],
            "products": hashlib.sha256(tables.encode()).hexdigest()[:16],
            # the CPU kernels' build (kernels/skinny.py): new kernels, new costs
            "kernels": skinny.build_tag() if model.device.type == "cpu" else None,
            # greedy steps' LM head: screened in bf16 (the logits not multiplied out) or not
            "head_screen": model.head_screen() is not None,
            # block-quantized products (models/loader.py ``weights``); absent for fp32, so that the
            # curves cached before the option existed still match
            **({} if (w := getattr(model, "weights", "fp32")) == "fp32" else {"weights": w}),
            # the exact path's kernels (kernels/backend.py TritonBackend); absent when off, likewise
            **({"exact": True} if model.backend.exact else {}),
            # the KV cache's dtype where it is not the model's (fp16 beside quantized products on a
            # CPU: Transformer.kv_cache_dtype); absent otherwise, likewise
            **({"kv": str(kv)} if (kv := model.kv_cache_dtype()) != model.dtype else {}),
            # the CPU stack's side stream forced on or off (kernels/skinny.py side_stream); absent
            # when it follows the cache size (a function of the machine and the step), likewise
            **({"side": side} if model.device.type == "cpu" and (side := os.environ.get("SPECDEC_SIDE_PREFETCH"))
               else {})}


# A curve this process checked or measured: (time.monotonic() then, the curve), per cache file
_checked: dict[str, tuple[float, "StepCost"]] = {}


def step_cost(model, cache_dir: Path | str, context: int = 256, reps: int = 3, measure=None, probe=None,
              check: bool = True, recheck_s: float = 0.0) -> StepCost:
    """The model's step cost: from the cache if it still matches the machine, else measured
    (``measure(model, context, reps)`` -> StepCost, the real measurement by default; tests pass
    a fake). ``check``: time ``CHECK_TOKENS``-token steps (``probe(model, context, tokens)`` ->
    {tokens: ms}, ``probe_step_cost`` by default) and measure again when the cached curve is
    off by more than ``CHECK_TOLERANCE``. ``recheck_s`` > 0: a curve this process checked or
    measured less than that many seconds ago is taken as it is, without a probe (a caller that
    plans many short calls: the probe takes 0.1-0.2 s, a measurement seconds)."""
    if not recheck_s >= 0:
        raise ValueError(f"recheck_s must be >= 0, got {recheck_s}")
    key = _key(model, context)
    path = Path(cache_dir) / "cost" / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
                                       + ".json")
    hit = _checked.get(str(path)) if check and recheck_s > 0 else None
    if hit is not None and (age := time.monotonic() - hit[0]) < recheck_s:
        cost = copy.copy(hit[1])
        cost.origin = f"checked by this process {age:.0f} s ago"
        return cost
    cost, origin = _read(path, key), "measured"
    if cost is not None and check:
        seen = (probe or probe_step_cost)(model, context, CHECK_TOKENS)
        drift = drifted(cost, seen)
        if drift is not None:
            warnings.warn(f"step-cost cache {path} no longer matches this machine ({drift}); measuring again")
            cost, origin = None, f"measured again ({drift})"
        else:
            checked = ", ".join(f"{t} tokens {ms:.1f} ms" for t, ms in sorted(seen.items()))
            origin = f"cache (checked now: {checked})"
    elif cost is not None:
        origin = "cache (not checked)"
    if cost is None:
        cost = (measure or measure_step_cost)(model, context, reps)
        write_whole(path, json.dumps({"key": key, "cost": asdict(cost)}, indent=1))
    cost.origin = origin
    if check:
        _checked[str(path)] = (time.monotonic(), cost)
    return cost


def drifted(cost: StepCost, seen: dict[int, float], tol: float = CHECK_TOLERANCE) -> Optional[str]:
    """None when steps timed now (``seen``: step tokens -> ms, one of them 1 token) agree with
    the curve within ``tol`` (relative, either way), else what disagrees: the one-token time,
    or the ratio of each larger step to it (the curve's shape, which the planner's choices
    follow)."""
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if 1 not in seen:
        raise ValueError(f"seen must hold a one-token step (the reference), got step sizes {sorted(seen)}")
    lo, hi = 1.0 / (1.0 + tol), 1.0 + tol
    one = seen[1] / cost.curve(1)
    if not lo <= one <= hi:
        return f"a one-token step takes {seen[1]:.1f} ms, the cache says {cost.curve(1):.1f}"
    for t in sorted(seen):
        if t == 1:
            continue
        now, then = seen[t] / seen[1], cost.curve(t) / cost.curve(1)
        if not lo <= now / then <= hi:
            return f"a {t}-token step costs {now:.2f}x a one-token step, the cache says {then:.2f}x"
    return None


def _parse(data: dict) -> StepCost:
    """A StepCost from its ``asdict`` form; ValueError saying what is wrong when it is not a
    usable curve (a repeated or decreasing step size, a cost that is not a positive finite
    number, a curve that falls, ...)."""
    if not isinstance(data, dict):
        raise ValueError(f"the curve must be an object of StepCost fields, got {type(data).__name__}")
    names = [f.name for f in fields(StepCost)]
    missing = [k for k in ("tokens", "ms", "per_seq_ms", "context") if k not in data]
    unknown = [k for k in data if k not in names]
    if missing or unknown:
        what = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has unknown fields {', '.join(unknown)}"]
                                                                       if unknown else [])
        raise ValueError(f"the curve {'; '.join(what)} (its fields: {', '.join(names)})")
    _sizes(data["tokens"], "tokens")
    _costs(data["ms"], "ms", len(data["tokens"]))
    if not all(b >= a for a, b in zip(data["ms"], data["ms"][1:])):
        raise ValueError(f"ms must not fall as the step grows (a larger step costs at least as much), got {data['ms']}")
    if not _finite(data["per_seq_ms"]) or data["per_seq_ms"] < 0:
        raise ValueError(f"per_seq_ms must be a finite number >= 0, got {data['per_seq_ms']!r}")
    if not _whole(data["context"]) or data["context"] < 1:
        raise ValueError(f"context must be an integer >= 1, got {data['context']!r}")
    long_context = data.get("long_context", 0)
    if not _whole(long_context) or long_context < 0:
        raise ValueError(f"long_context must be an integer >= 0 (0: not measured), got {long_context!r}")
    long_tokens, long_ms = data.get("long_tokens", []), data.get("long_ms", [])
    if long_context:
        if long_context <= data["context"]:
            raise ValueError(f"long_context ({long_context}) must be above context ({data['context']})")
        _sizes(long_tokens, "long_tokens")
        _costs(long_ms, "long_ms", len(long_tokens))
    elif long_tokens or long_ms:
        raise ValueError("long_tokens and long_ms go with a long_context above 0")
    return StepCost(**data)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _sizes(ts, name: str) -> None:
    """Step sizes: at least two integers >= 1, each larger than the one before."""
    if not isinstance(ts, list) or len(ts) < 2 or not all(_whole(t) and t >= 1 for t in ts):
        raise ValueError(f"{name} must be a list of at least two step sizes (integers >= 1), got {ts!r}")
    for a, b in zip(ts, ts[1:]):
        if b <= a:
            raise ValueError(f"{name} must increase, got {ts}: " + (f"step size {a} is repeated" if a == b
                                                                     else f"{b} follows {a}"))


def _costs(ms, name: str, n: int) -> None:
    """One finite cost > 0 (ms) per step size."""
    if not isinstance(ms, list) or len(ms) != n:
        raise ValueError(f"{name} must be a list of {n} costs (one per step size), got {ms!r}")
    bad = [m for m in ms if not _finite(m) or m <= 0]
    if bad:
        raise ValueError(f"{name} must be finite costs > 0 (ms), got {bad[0]!r} in {ms}")


def _read(path: Path, key: dict) -> Optional[StepCost]:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data["key"] != key:
            warnings.warn(f"step-cost cache {path} was written for another setup ({data['key']}); measuring again")
            return None
        return _parse(data["cost"])
    except (ValueError, KeyError, TypeError) as e:
        warnings.warn(f"step-cost cache {path} is unreadable ({e}); measuring again")
        return None


def save_step_cost(cost: StepCost, path: Path | str) -> None:
    """Write ``cost`` to ``path`` (JSON, the cache's ``cost`` part) so that a later run can plan
    with exactly this curve (``load_step_cost``), on this machine or another."""
    write_whole(path, json.dumps({"cost": asdict(cost), "origin": cost.origin}, indent=1))


def load_step_cost(path: Path | str) -> StepCost:
    """The curve in ``path``: a file ``save_step_cost`` wrote (a benchmark's
    ``OUT/step_cost.json``) or a cache file of ``step_cost``. It is used as it is: no check
    against this machine (pinning a curve is the point). ValueError naming the file and what
    is wrong with it otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"step-cost file {path} is a folder, not a file")
    if not path.is_file():
        raise ValueError(f"step-cost file {path} does not exist")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"step-cost file {path} is not JSON ({e})") from None
    if not isinstance(data, dict) or "cost" not in data:
        raise ValueError(f"step-cost file {path} has no 'cost' entry: expected a file save_step_cost wrote (a "
                         f"benchmark's OUT/step_cost.json) or a file of the step-cost cache")
    try:
        cost = _parse(data["cost"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"step-cost file {path} is not a usable step-cost curve: {e}") from None
    cost.origin = f"file {path}"
    return cost


@dataclass(frozen=True)
class Roofline:
    """What one forward must do at least, for a model on a machine: read its weights once and
    each sequence's keys and values, and do its products' and attention's arithmetic, at the
    machine's measured read bandwidth and FMA peak (bench/model_speed.py measures both)."""

    weight_bytes: int  # read once per forward (bench/model_speed.weight_bytes)
    row_flops: int  # the products' flops per step row, the LM head's included
    attn_flops: int  # attention flops per step row and key (4 x layers x heads x head_dim)
    kv_bytes: int  # key and value bytes per committed token, every layer
    peak_gflops: float
    bandwidth_gbs: float

    def __post_init__(self):
        for name in ("weight_bytes", "row_flops", "attn_flops", "kv_bytes", "peak_gflops", "bandwidth_gbs"):
            v = getattr(self, name)
            if not _finite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")

    def forward_ms(self, step_tokens: list[int], contexts: list[int]) -> float:
        """The floor of one forward: the larger of its bytes at the bandwidth and its flops at
        the peak (each sequence's rows attend its context and the step's own tokens)."""
        nbytes = self.weight_bytes + sum(self.kv_bytes * (c + t) for t, c in zip(step_tokens, contexts))
        flops = sum(t * self.row_flops + self.attn_flops * t * (c + t) for t, c in zip(step_tokens, contexts))
        return max(nbytes / (self.bandwidth_gbs * 1e6), flops / (self.peak_gflops * 1e6))

    def step_cost(self, scale: float = 1.0, context: int = 256, long_context: int = 1024,
                  tokens: tuple[int, ...] = GRID) -> StepCost:
        """The curve a machine whose every forward took ``scale`` x its floor would measure
        (``measure_step_cost``'s grid and batches), for ``--emulate-cost``: with a scale at which
        the curve is slower than this machine at every step size, an emulated run plans and
        decodes as if the kernels ran at the roofline (only the host's work keeps its real time,
        so its share is smaller than it would be: what such a run measures is an upper bound)."""
        if not (_finite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        if not 1 <= context < long_context:
            raise ValueError(f"need 1 <= context < long_context, got {context}, {long_context}")
        ms = [scale * self.forward_ms([t], [context]) for t in tokens]
        one = [scale * self.forward_ms([1] * b, [context] * b) for b in BATCHES]
        per_seq = statistics.median((o - ms[tokens.index(b)] if b in tokens else 0.0) / (b - 1)
                                    for o, b in zip(one, BATCHES))
        long_ms = [scale * self.forward_ms([t], [long_context]) for t in LONG_GRID]
        cost = StepCost(list(tokens), ms, max(0.0, per_seq), context, long_context, list(LONG_GRID), long_ms)
        cost.origin = (f"roofline x {scale:g}: {self.peak_gflops:.0f} GFLOP/s, {self.bandwidth_gbs:.1f} GB/s, "
                       f"{self.weight_bytes / 1e9:.3f} GB of weights")
        return cost


@torch.inference_mode()
def measure_step_cost(model, context: int = 256, reps: int = 3) -> StepCost:
    """Time the model's forward on this device (random tokens; costs do not depend on them)."""
    from models.runner import ModelRunner, StepInput

    gen = torch.Generator().manual_seed(0)
    dev = model.device
    long_context = min(4 * context, model.cfg.max_position_embeddings - max(GRID) - 1)
    runner = ModelRunner(model, cache_tokens=max(max(BATCHES) * (context + max(GRID) + 32),
                                                 long_context + max(GRID) + 32), block_size=16)

    best: dict = {}

    def timed(key, inputs) -> None:
        """Time one forward of ``inputs``; keep the fastest over the rounds."""
        tokens, meta, idx = runner.prepare(inputs)
        t = time.perf_counter()
        # a greedy step's forward: from a CUDA graph where the model replays them, with the LM head's
        # screen where it has one (the logits are not multiplied out there)
        runner.forward_greedy(tokens, meta, idx)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best[key] = min(best.get(key, float("inf")), (time.perf_counter() - t) * 1e3)

    def fresh(batch: int, length: int = context) -> list[int]:
        for s in runner.seq_ids:
            runner.free(s)
        for s in range(batch):
            runner.add_sequence(s)
            runner.assume_context(s, length)
        return list(range(batch))

    vocab = model.cfg.vocab_size
    trees = {T: tree_step(T, vocab, gen) for T in sorted(set(GRID) | set(LONG_GRID))}
    ones = [int(t) for t in torch.randint(0, vocab, (max(BATCHES),), generator=gen)]
    # Rounds over the whole grid (the first one also warms up), each point's fastest time kept:
    # a transient (another process, a page-fault storm after a load) hits one round of a point,
    # not all of them, so it cannot end up in the cached curve.
    for _ in range(reps + 1):
        fresh(1)
        for T in GRID:
            timed(("step", T), [trees[T]])
        for b in BATCHES:
            timed(("batch", b), [StepInput(s, [ones[s]]) for s in fresh(b)])
        if long_context > context:
            fresh(1, long_context)
            for T in LONG_GRID:
                timed(("long", T), [trees[T]])
    ms = [best[("step", T)] for T in GRID]
    for i in range(1, len(ms)):
        ms[i] = max(ms[i], ms[i - 1])
    base = StepCost(list(GRID), ms, 0.0, context)
    extra = [max(0.0, (best[("batch", b)] - base.curve(b)) / (b - 1)) for b in BATCHES]
    long_ms = [best[("long", T)] for T in LONG_GRID] if long_context > context else []
    for s in runner.seq_ids:
        runner.free(s)
    return StepCost(list(GRID), ms, statistics.median(extra), context,
                    long_context if long_ms else 0, list(LONG_GRID) if long_ms else [], long_ms)


@torch.inference_mode()
def probe_step_cost(model, context: int = 256, tokens: tuple[int, ...] = CHECK_TOKENS, rounds: int = 3,
                    min_s: float = 0.1, max_rounds: int = 30) -> dict[int, float]:
    """Forward ms of one step of each of ``tokens`` tokens (batch 1, ``context`` committed
    tokens, random draft trees as in ``measure_step_cost``): the fastest of ``rounds`` rounds
    after a warm-up round, more (up to ``max_rounds``) while they took less than ``min_s``
    seconds, so that sub-millisecond steps are not judged on a few noisy timings. A fraction
    of a second: what ``step_cost`` checks a cache with."""
    from models.runner import ModelRunner

    if rounds < 1 or max_rounds < rounds:
        raise ValueError(f"rounds must be >= 1 and max_rounds >= rounds, got {rounds} and {max_rounds}")
    if not tokens or min(tokens) < 1:
        raise ValueError(f"tokens must be a non-empty list of step sizes >= 1, got {tokens}")
    if not min_s >= 0:
        raise ValueError(f"min_s must be >= 0, got {min_s}")
    gen = torch.Generator().manual_seed(0)
    runner = ModelRunner(model, cache_tokens=context + max(tokens) + 32, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, context)
    steps = {T: runner.prepare([tree_step(T, model.cfg.vocab_size, gen)]) for T in tokens}
    best = {T: float("inf") for T in tokens}
    try:
        r, start = 0, None
        while r <= rounds or (r <= max_rounds and time.perf_counter() - start < min_s):
            if r == 1:
                start = time.perf_counter()
            for T, (toks, meta, idx) in steps.items():
                t = time.perf_counter()
                runner.forward_greedy(toks, meta, idx)
                if model.device.type == "cuda":
                    torch.cuda.synchronize(model.device)
                if r:  # round 0 warms up
                    best[T] = min(best[T], (time.perf_counter() - t) * 1e3)
            r += 1
    finally:
        runner.free(0)
    return best


def tree_step(T: int, vocab: int, gen: torch.Generator):
    """Sequence 0's step of T random tokens in a random draft tree (one token: no mask), as
    speculative methods send: what the step cost is measured with."""
    from models.runner import StepInput

    depths, mask = random_tree(T, gen)
    toks = torch.randint(0, vocab, (T,), generator=gen).tolist()
    return StepInput(0, toks, depths, None if T == 1 else mask)


def random_tree(T: int, gen: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """Depths and (T, T) visibility of a random tree rooted at node 0 (chains with branches)."""
    parent = [-1] + [max(0, i - 1 - int(torch.randint(0, 3, (1,), generator=gen))) for i in range(1, T)]
    mask = torch.zeros(T, T, dtype=torch.bool)
    depth = [0] * T
    for i in range(T):
        mask[i, i] = True
        if parent[i] >= 0:
            mask[i] |= mask[parent[i]]
            depth[i] = depth[parent[i]] + 1
    return depth, mask
