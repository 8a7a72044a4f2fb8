"""Host pieces of a planned step in the real loop, each wrapped with perf_counter (us, medians)."""

import collections
import json
import statistics
import sys
import time

sys.path.insert(0, ".")
import importlib

G = importlib.import_module("decoding.generate")
from decoding import make_proposer
from decoding.options import planner_for
from decoding.stats import StepClock
from models.loader import load_model
from models.machine import DEFAULT_CACHE_DIR
import models.runner as MR

model = load_model("smollm2").model
prompts = json.load(open("/tmp/host_step_answers.json"))["prompts"][:5]
acc = collections.defaultdict(list)


def wrap(obj, name, label):
    f = getattr(obj, name)

    def w(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[label].append((time.perf_counter() - t) * 1e6)
        return r

    setattr(obj, name, w)


for m in sys.argv[1].split(","):
    prop = make_proposer(m)
    planner = None if "NOPLAN" in __import__("os").environ else planner_for(model, m, False, DEFAULT_CACHE_DIR)
    acc.clear()
    cls = type(prop)
    saved = {n: getattr(cls, n) for n in ("update", "propose")}
    wrap(cls, "update", "proposer.update")
    wrap(cls, "propose", "proposer.propose")
    tsaved = []
    if m == "hybrid":
        from decoding import compiled_draft as CD

        for c, n in ((CD.CNgramPool, "window_update"),):
            tsaved.append((c, n, getattr(c, n)))
            wrap(c, n, c.__name__ + "." + n)
    psaved = (
        {n: getattr(type(planner), n) for n in ("observe_step", "select", "step_times", "max_depth")} if planner else {}
    )
    for n in psaved:
        wrap(type(planner), n, "planner." + n)
    gsaved = {n: getattr(G, n) for n in ("settle", "send", "record", "decode_step")}
    import os

    if "KEEP" in os.environ:
        keep = []
        ds = G.decode_step

        def kept(*a, **k):
            r = ds(*a, **k)
            keep.append(r)
            return r

        G.decode_step = kept
        gsaved["decode_step"] = ds
    for n in ("settle", "send", "record"):
        wrap(G, n, n)
    rsaved = {n: getattr(MR.ModelRunner, n) for n in ("commit", "step_greedy", "_forward_ranked", "prepare")}
    for n in rsaved:
        wrap(MR.ModelRunner, n, "runner." + n)
    clock = StepClock()
    import gc

    if "NOGC" in os.environ:
        gc.disable()
    if "FREEZE" in os.environ:
        gc.collect()
        gc.freeze()
    for pr in prompts:
        G.generate(model, [pr], prop, max_new_tokens=128, planner=planner, step_clock=clock)
    for n, f in saved.items():
        setattr(cls, n, f)
    for c, n, f in tsaved:
        setattr(c, n, f)
    for n, f in psaved.items():
        setattr(type(planner), n, f)
    for n, f in gsaved.items():
        setattr(G, n, f)
    for n, f in rsaved.items():
        setattr(MR.ModelRunner, n, f)
    print(
        m,
        {k: round(v * 1e3 / clock.steps, 1) for k, v in clock.ms.items()}
        if hasattr(clock, "ms")
        else clock.__dict__.keys(),
    )
    for k, v in acc.items():
        print(f"  {k:24s} n={len(v):5d} median {statistics.median(v):7.1f} us  mean {statistics.mean(v):7.1f}")
