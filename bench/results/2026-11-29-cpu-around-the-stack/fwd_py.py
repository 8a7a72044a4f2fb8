"""Per-step time of the forward outside its two C calls (the layer stack, the head) in the real loop."""

import collections
import json
import statistics
import sys
import time

sys.path.insert(0, ".")
import models.runner as MR
from kernels import skinny, quant
from decoding import generate, make_proposer
from decoding.options import planner_for
from models.loader import load_model
from models.machine import DEFAULT_CACHE_DIR

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


wrap(MR.ModelRunner, "_forward_ranked", "fwd")
wrap(skinny, "layers_unchecked", "stack")
wrap(quant, "topk_unchecked", "head")
for m in sys.argv[1].split(","):
    planner = planner_for(model, m, False, DEFAULT_CACHE_DIR)
    acc.clear()
    t0 = time.perf_counter()
    for pr in prompts:
        generate(model, [pr], make_proposer(m), max_new_tokens=128, planner=planner)
    wall = time.perf_counter() - t0
    n = len(acc["fwd"])
    py = [f - s - h for f, s, h in zip(acc["fwd"], acc["stack"][-n:], acc["head"][-n:])]
    print(
        f"{m:14s} steps {n:4d} forward outside its C calls: median {statistics.median(py):6.1f} us, "
        f"mean {statistics.mean(py):6.1f}; "
        f"forward median {statistics.median(acc['fwd']):7.1f} us; wall {wall:.2f} s",
        flush=True,
    )
