"""What bench/run.py measures around one generate call: wall time over repeats, time to first
token, tokens gained per step and peak memory.

* Time to first token: from the start of the call to the first ``on_tokens`` call of a
  sequence (``decoding.generate``) or the first streamed token (transformers); it covers
  the prefill of every prompt in the batch and the first token.
* Tokens per step: the sizes of the later ``on_tokens`` calls, one per forward after the
  one that saw the prompt (the accepted draft tokens plus the model's own next token).
* Peak memory: :class:`PeakMemory` says in ``kind`` what it measures on this device.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

MIB = 2 ** 20


class TokenClock:
    """``on_tokens`` for one call: the time of each sequence's first tokens and the number of
    tokens every later call brings."""

    def __init__(self, n: int):
        self.t0 = time.perf_counter()
        self.first: list[Optional[float]] = [None] * n
        self.steps: list[list[int]] = [[] for _ in range(n)]

    def __call__(self, index: int, tokens: list[int]) -> bool:
        if self.first[index] is None:
            self.first[index] = time.perf_counter() - self.t0
        else:
            self.steps[index].append(len(tokens))
        return False  # never stops a sequence


def _status_kib(field_name: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Peak memory of one run, in MiB: the peak itself and its rise over what was in use when
    the run started. CUDA: the torch allocator's peak (``max_memory_allocated``, reset before
    each run). Linux CPU: the process's resident-set high-water mark (VmHWM), reset before
    each run by writing 5 to /proc/self/clear_refs. Elsewhere: ``ru_maxrss``, the lifetime
    peak, which cannot be reset (a run then only shows how far it raised the lifetime peak)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.device = device
        self.proc = not self.cuda and _status_kib("VmHWM") is not None and self._reset_hwm()
        if self.cuda:
            self.kind = ("CUDA memory allocated by torch: peak of the run (max_memory_allocated, reset before each "
                         "run; weights and cache included); +run: peak minus allocated at its start")
        elif self.proc:
            self.kind = ("process resident set: peak of the run (VmHWM, reset before each run through "
                         "/proc/self/clear_refs; the whole process, weights included); "
                         "+run: peak minus RSS at its start")
        else:
            self.kind = ("process lifetime peak RSS (ru_maxrss; cannot be reset, so a run's peak includes "
                         "every earlier "
                         "run's); +run: how far the run raised it")

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def _maxrss_kib() -> int:
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r // 1024 if sys.platform == "darwin" else r  # bytes on macOS, KiB on Linux

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device) / MIB
        elif self.proc:
            self._reset_hwm()
            self.base = _status_kib("VmRSS") / 1024
        else:
            self.base = self._maxrss_kib() / 1024

    def stop(self) -> tuple[float, float]:
        """(peak MiB, rise over the start MiB)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) / MIB
        elif self.proc:
            peak = _status_kib("VmHWM") / 1024
        else:
            peak = self._maxrss_kib() / 1024
        return peak, max(peak - self.base, 0.0)


@dataclass
class Measured:
    """One method on one batch over its repeats. ``outputs`` are the first repeat's (one dict
    per sequence, as the call returned them, plus ``accept_lengths``); ``secs`` the wall time
    of each repeat; ``ttft`` the median over repeats of each sequence's time to first token;
    ``decode_secs`` each repeat's decoding time: its wall time after the last sequence's first token
    (a batch decodes together once its prefill is done), None where a sequence had no first token."""
    outputs: list[dict]
    secs: list[float]
    ttft: list[Optional[float]]
    peak_mib: float
    peak_rise_mib: float
    extra: dict = field(default_factory=dict)
    decode_secs: list[Optional[float]] = field(default_factory=list)


def measure(call: Callable[[TokenClock], tuple[list[dict], dict]], n: int, repeats: int,
            memory: PeakMemory) -> Measured:
    """Run ``call(clock)`` ``repeats`` times (it must pass ``clock`` as its on_tokens and
    return (per-sequence dicts, extra)); time each run to the last token on the device."""
    secs, firsts, outputs, extra, peaks, decode = [], [], None, {}, [], []
    for _ in range(repeats):
        memory.start()
        clock = TokenClock(n)
        res, ex = call(clock)
        if memory.cuda:
            torch.cuda.synchronize(memory.device)
        secs.append(time.perf_counter() - clock.t0)
        peaks.append(memory.stop())
        firsts.append(clock.first)
        decode.append(secs[-1] - max(clock.first) if n and None not in clock.first else None)
        if outputs is None:
            outputs, extra = res, ex
            for o, steps in zip(outputs, clock.steps):
                o["accept_lengths"] = steps
    ttft = [statistics.median(f[i] for f in firsts) if all(f[i] is not None for f in firsts) else None
            for i in range(n)]
    return Measured(outputs, secs, ttft, max(p for p, _ in peaks), max(d for _, d in peaks), extra, decode)


def merge(rounds: list[Measured]) -> Measured:
    """One method's measurements from separate rounds (``measure`` with one repeat each, the
    other methods run in between) as one ``Measured``: the first round's outputs, every
    round's wall and decoding times, the median time to first token, the highest peak."""
    if not rounds:
        raise ValueError("rounds is empty: give at least one measurement")
    first = rounds[0]
    secs = [s for m in rounds for s in m.secs]
    ttft = []
    for i in range(len(first.ttft)):
        seen = [m.ttft[i] for m in rounds]
        ttft.append(statistics.median(seen) if all(t is not None for t in seen) else None)
    return Measured(first.outputs, secs, ttft, max(m.peak_mib for m in rounds),
                    max(m.peak_rise_mib for m in rounds), first.extra, [d for m in rounds for d in m.decode_secs])


def env_cpu_name() -> str:
    """The CPU by name, family / model and L3 (models.machine.cpu_model), its cores and the threads
    torch runs: results of two CPUs say which is which."""
    from models.machine import cpu_model
    return f"CPU ({cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
