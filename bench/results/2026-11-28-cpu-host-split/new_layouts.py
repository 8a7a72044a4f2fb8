"""How many steps meet a block-table layout the staging has not made yet (models/packing.py
``Staging.step`` calls): bench/host_step.py's oracle, hot, the suite's five test prompts in one
process (one thread's staging), planned on the pinned curve. The repository to import from is
argv[1], so the code before a change (a worktree) and after it run the same script.

    (cd ROOT && .venv/bin/python bench/results/2026-11-28-cpu-host-split/new_layouts.py ROOT \\
        ar,pld,suffix,lookahead+pld,hybrid)

Needs /tmp/host_step_answers.json (``bench/host_step.py --answers /tmp/host_step_answers.json``).
"""
import importlib
import json
import sys

sys.path.insert(0, sys.argv[1])

from bench import host_step as hs  # noqa: E402
from decoding import make_proposer  # noqa: E402
from decoding.planner import Planner, PlannerConfig  # noqa: E402
from models import packing  # noqa: E402
from models.cost import load_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

G = importlib.import_module("decoding.generate")
made = [0]
_step = packing.Staging.step


def counted_step(self, *args, **kw):
    made[0] += 1
    return _step(self, *args, **kw)


def main():
    packing.Staging.step = counted_step
    model = load_model("smollm2").model
    saved = json.load(open("/tmp/host_step_answers.json"))
    cost = load_step_cost(str(hs.DEFAULT_COST))
    for name in sys.argv[2].split(","):
        made[0] = steps = 0
        for p, ref in zip(saved["prompts"], saved["answers"]):
            runner = hs.OracleRunner(model, {0: ref}, None, cache_tokens=16 * (-(-(len(p) + 128 + 256) // 16)))
            planner = Planner(cost, PlannerConfig(learn_overhead=False)) if name != "ar" else None
            out = G.generate(model, [p], make_proposer(name), max_new_tokens=128, planner=planner, runner=runner)
            steps += out[0].stats.forwards
        print(f"{sys.argv[1]} {name}: {steps} steps, {made[0]} new layouts ({made[0] / steps:.2f} a step)")


if __name__ == "__main__":
    main()
