"""In the real decoding loop (the default model, 5 prompts of bench/host_step.py's answers file, 128
tokens, the planner on with the curve the run finds cached or measures): each forward's time, by
its step tokens T, against what the planner's curve predicts for that step at its context
(medians). The forward is timed around ModelRunner._forward_ranked (a greedy CPU step's forward
with the quantized head ranking its logits). Run from the repository root:

    python bench/host_step.py --answers /tmp/host_step_answers.json   # once: the prompts
    python bench/results/2026-11-29-cpu-curve-error/loop_cost.py pld,ar,hybrid,ar
"""
import collections
import json
import statistics
import sys
import time

sys.path.insert(0, ".")
import models.runner as MR  # noqa: E402
from decoding import generate, make_proposer  # noqa: E402
from decoding.options import planner_for  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.machine import DEFAULT_CACHE_DIR  # noqa: E402

model = load_model("smollm2").model
prompts = json.load(open("/tmp/host_step_answers.json"))["prompts"][:5]
rec, info = [], []
forward, prepare = MR.ModelRunner._forward_ranked, MR.ModelRunner.prepare


def timed_forward(self, *a, **k):
    t = time.perf_counter()
    out = forward(self, *a, **k)
    rec.append(((time.perf_counter() - t) * 1e3,) + info[-1])
    return out


def noted_prepare(self, inputs, *a, **k):
    info.append((sum(len(i.tokens) for i in inputs), self.context_len(inputs[0].seq_id)))
    return prepare(self, inputs, *a, **k)


MR.ModelRunner._forward_ranked, MR.ModelRunner.prepare = timed_forward, noted_prepare
cost = None
for m in sys.argv[1].split(","):
    planner = planner_for(model, m, False, DEFAULT_CACHE_DIR)
    if planner is not None:
        cost = planner.cost
    rec.clear()
    info.clear()
    for pr in prompts:
        generate(model, [pr], make_proposer(m), max_new_tokens=128, planner=planner)
    print(m, "steps", len(rec), "curve:", (cost.tokens[:6], [round(x, 2) for x in cost.ms[:6]]) if cost else None)
    by = collections.defaultdict(list)
    for ms, T, ctx in rec:
        by[T].append((ms, cost([T], [ctx]) if cost else float("nan")))
    for T in sorted(by):
        v = by[T]
        meas, pred = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
        print(f"  T={T:3d} n={len(v):4d} measured median {meas:6.2f} ms, predicted median {pred:6.2f}, "
              f"ratio {meas / pred:5.2f}")
