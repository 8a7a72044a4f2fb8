"""Per call, in the real decoding loop (the default GGUF, native weights, 2 threads, the planner
on): the median and the total per step of the step's host functions, and the step clock's phases
(decoding.stats.StepClock), for the methods named; prompts: the first two of bench/host_step.py's
answers file, one at a time. The wrappers add their own time (about a microsecond a call).

    python bench/host_step.py --answers /tmp/host_step_answers.json   # once: the prompts
    python loop_calls.py ar,hybrid
"""
import functools
import json
import os
import sys
import time

sys.path.insert(0, ".")
import decoding.generate  # noqa: E402,F401
from decoding import generate, make_proposer  # noqa: E402
from decoding.options import planner_for  # noqa: E402
from decoding.stats import StepClock  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.machine import DEFAULT_CACHE_DIR  # noqa: E402

G = sys.modules["decoding.generate"]
import decoding.planner as PL  # noqa: E402
import decoding.proposer as P  # noqa: E402
import decoding.stats as S  # noqa: E402
import decoding.tree as T  # noqa: E402
import models.runner as MR  # noqa: E402

acc = {}


def wrap(obj, name, label=None):
    label = label or f"{getattr(obj, '__name__', obj)}.{name}"
    f = getattr(obj, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc.setdefault(label, []).append(time.perf_counter() - t)
    setattr(obj, name, w)


model = load_model("smollm2").model
prompts = json.load(open(os.environ.get("ANSWERS", "/tmp/host_step_answers.json")))["prompts"][:2]
methods = sys.argv[1].split(",")
done = set()
for m in methods:
    for cls in type(make_proposer(m)).__mro__:
        if cls in done or cls is object:
            continue
        for name in ("propose", "verify", "update"):
            if name in cls.__dict__:
                wrap(cls, name)
        done.add(cls)
for name in ("max_depth", "select", "observe_all", "observe_time"):
    wrap(PL.Planner, name)
for name in ("prepare", "commit"):
    wrap(MR.ModelRunner, name)
wrap(MR, "argmax_rows")
wrap(MR, "argmax_topk_rows")
wrap(P.Sequence, "append")
wrap(G, "_step_input")
wrap(T.StepTree, "subtree")
wrap(T.StepTree, "logit_nodes")
wrap(S.SeqStats, "record")
for rnd in range(2):
    for m in methods:
        acc.clear()
        clock = StepClock()
        for pr in prompts:
            generate(model, [pr], make_proposer(m), max_new_tokens=128, step_clock=clock,
                     planner=planner_for(model, m, False, DEFAULT_CACHE_DIR))
        ps = clock.per_step()
        print(m, {k: round(v, 3) for k, v in ps.items()})
        for k, ts in sorted(acc.items(), key=lambda kv: -sum(kv[1])):
            ts = sorted(ts)
            print(f"   {k:34s} {len(ts):5d} calls, median {ts[len(ts) // 2] * 1e6:7.1f} us, "
                  f"{sum(ts) * 1e6 / ps['steps']:7.1f} us a step")
