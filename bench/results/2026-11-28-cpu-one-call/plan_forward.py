"""The planner's step cycle (as nt_stream.py) right after a real one-token step_greedy of the
default GGUF (native weights, 512-token context); medians of 150. Run from the root of the code:

    python plan_forward.py LABEL
"""
import sys
import time
import random
sys.path.insert(0, ".")
from bench.host_step import DEFAULT_COST
from decoding import compiled_draft
from decoding.planner import Planner, PlannerConfig
from decoding.proposer import Outcome
from decoding.tree import PLD
from models.cost import load_step_cost
from models.loader import load_model
from models.runner import ModelRunner, StepInput
model = load_model("smollm2").model
runner = ModelRunner(model, cache_tokens=4096)
runner.add_sequence(0)
prompt = list(range(100, 612))
runner.step([StepInput(0, prompt)])
runner.commit({0: list(range(len(prompt)))})
cost = load_step_cost(DEFAULT_COST)
compiled_draft.LIBRARY.get()
buf = compiled_draft.TreeBuf()
plan = Planner(cost, PlannerConfig())
rng = random.Random(0)
fw, cyc = [], []
for step in range(150):
    t = time.perf_counter()
    runner.step_greedy([StepInput(0, [5])], k=1)
    fw.append(time.perf_counter() - t)
    t0 = time.perf_counter()
    plan.max_depth([0], PLD, [600 + step])
    buf.start(5, 16)
    buf.add_chain([rng.randrange(3) for _ in range(8)], PLD, 16)
    tree = buf.step_tree()
    keep = plan.select([0], [tree])
    k = keep[0]
    out = Outcome(tree=tree, path=[0], new_tokens=[1], logits=None, rows={n: j for j, n in enumerate(k)}, sent=len(k))
    plan.observe_all([0], [out])
    plan.observe_time([len(k)], 4.5, 1)
    cyc.append(time.perf_counter() - t0)
print(f"{sys.argv[1] if len(sys.argv) > 1 else ''} step_greedy {sorted(fw)[75]*1e3:.2f} ms, "
      f"planner cycle after it {sorted(cyc)[75]*1e6:.1f} us")
