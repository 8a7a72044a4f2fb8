"""The planner's four calls of a step alone (one sequence, an 8-token pld chain built in C, the
default step-cost curve), cold (MB megabytes read before each step; default 100) and hot (the
same calls again at once); medians of 300 steps. Run from the root of the code to time:

    python plan_cold.py [MB]
"""
import sys
import time
import random
sys.path.insert(0, ".")
import torch
from bench.host_step import DEFAULT_COST
from decoding import compiled_draft
from decoding.planner import Planner, PlannerConfig
from decoding.proposer import Outcome
from decoding.tree import PLD
from models.cost import load_step_cost
cost = load_step_cost(DEFAULT_COST)
plan = Planner(cost, PlannerConfig())
assert plan._core is not None
compiled_draft.LIBRARY.get()
buf = compiled_draft.TreeBuf()
junk = torch.ones(int(sys.argv[1]) * (1 << 18) if len(sys.argv) > 1 else 100 * (1 << 18))
rng = random.Random(0)
times = {k: ([], []) for k in ("max_depth", "select", "observe_all", "observe_time")}
for step in range(300):
    for cold in (True, False):
        if cold:
            junk.sum()
        t0 = time.perf_counter()
        d = plan.max_depth([0], PLD, [600 + step])
        t1 = time.perf_counter()
        buf.start(5, 16)
        buf.add_chain([rng.randrange(3) for _ in range(8)], PLD, 16)
        tree = buf.step_tree()
        t2 = time.perf_counter()
        keep = plan.select([0], [tree])
        t3 = time.perf_counter()
        k = keep[0]
        path = [n for n in k if n <= rng.randrange(len(k))]
        out = Outcome(tree=tree, path=path, new_tokens=[1] * len(path), logits=None,
                      rows={n: j for j, n in enumerate(k)}, sent=len(k))
        t4 = time.perf_counter()
        plan.observe_all([0], [out])
        t5 = time.perf_counter()
        plan.observe_time([len(k)], 4.5, len(path))
        t6 = time.perf_counter()
        i = 0 if cold else 1
        times["max_depth"][i].append(t1 - t0)
        times["select"][i].append(t3 - t2)
        times["observe_all"][i].append(t5 - t4)
        times["observe_time"][i].append(t6 - t5)
tot = [0.0, 0.0]
for k, (c, h) in times.items():
    c, h = sorted(c)[150] * 1e6, sorted(h)[150] * 1e6
    tot[0] += c
    tot[1] += h
    print(f"{k:14s} cold {c:6.1f} us  hot {h:6.1f} us")
print(f"{'total':14s} cold {tot[0]:6.1f} us  hot {tot[1]:6.1f} us")
