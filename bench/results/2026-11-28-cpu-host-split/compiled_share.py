"""How much of a step's host work runs inside compiled code: bench/host_step.py's oracle (the
default GGUF, the suite's five test prompts, 128 tokens, planned on the pinned curve, 100 MB read in
each forward's place so that the caches are as cold as the loop leaves them), with every call of
the decoding glue extension (decoding/cpu/glue.c), the packing extension's ``pack_staged`` and the
ctypes K/V move timed from around the call; the rest of the step clock's host time is Python.

    flock /tmp/timing.lock .venv/bin/python bench/results/2026-11-28-cpu-host-split/compiled_share.py \\
        ar,pld,suffix,lookahead+pld,hybrid

Needs /tmp/host_step_answers.json (``bench/host_step.py --answers /tmp/host_step_answers.json``).
The timer around a call adds a Python frame of its own to what it measures: an upper bound. Each
method runs two rounds; the second is printed.
"""
import collections
import importlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench import host_step as hs  # noqa: E402
from decoding import compiled, make_proposer  # noqa: E402
from decoding.planner import Planner, PlannerConfig  # noqa: E402
from decoding.stats import StepClock  # noqa: E402
from models import packing  # noqa: E402
from models.cost import load_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

G = importlib.import_module("decoding.generate")
spent: dict = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def timed(obj, attr: str, label: str) -> None:
    f = getattr(obj, attr)

    def call(*args, **kw):
        t = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            spent[label] += time.perf_counter() - t
            calls[label] += 1

    setattr(obj, attr, call)


def main():
    model = load_model("smollm2").model
    saved = json.load(open("/tmp/host_step_answers.json"))
    cost = load_step_cost(str(hs.DEFAULT_COST))
    flush = torch.ones(100 * (1 << 18))
    glue, ext = compiled.glue(), packing.EXT.get()
    packing.LIBRARY.get()
    for name in ("select", "observe_all", "max_depth", "draft", "learn", "window_update", "append_tail"):
        timed(glue, name, "glue." + name)
    timed(ext, "pack_staged", "packext.pack_staged")
    timed(packing.LIBRARY.lib, "pack_kv_move", "ctypes.pack_kv_move")
    for name in sys.argv[1].split(","):
        for _ in range(2):
            spent.clear()
            calls.clear()
            clock = StepClock()
            for p, ref in zip(saved["prompts"], saved["answers"]):
                runner = hs.OracleRunner(model, {0: ref}, flush, cache_tokens=16 * (-(-(len(p) + 128 + 256) // 16)))
                planner = Planner(cost, PlannerConfig(learn_overhead=False)) if name != "ar" else None
                G.generate(model, [p], make_proposer(name), max_new_tokens=128, planner=planner, runner=runner,
                           step_clock=clock)
        per = clock.per_step()
        steps = per["steps"]
        inside = sum(spent.values()) / steps * 1e3
        print(f"{name}: host {per['host']:.3f} ms a step; inside compiled calls {inside:.3f} ms "
              f"({sum(calls.values()) / steps:.1f} calls a step)")
        for k, v in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"    {k:24s} {v / steps * 1e3:.4f} ms  ({calls[k] / steps:.2f} a step, "
                  f"{v / calls[k] * 1e6:.1f} us each)")


if __name__ == "__main__":
    main()
