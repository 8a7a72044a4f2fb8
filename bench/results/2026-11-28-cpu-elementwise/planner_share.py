"""The step planner's share of the host work alone (bench/host_step.py's oracle, 100 MB read in each
forward's place, 5 prompts, batch 1, the pinned reference curve): each planner call timed from
around it (a frame of its own: an upper bound), ms a step, the fastest of 3 rounds by host time.
argv: methods. Run from the repository root of the code to measure."""
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
sys.path.insert(0, str(Path.cwd() / "bench"))
import host_step  # noqa: E402

from decoding import planner as pl  # noqa: E402
from models.cost import load_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

spent = collections.Counter()


def timed(name):
    f = getattr(pl.Planner, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        spent[name] += time.perf_counter() - t
        return r
    setattr(pl.Planner, name, wrapper)


for n in ("max_depth", "select", "observe_all", "observe_time", "observe_step"):
    if hasattr(pl.Planner, n):
        timed(n)
saved = json.loads(Path("/tmp/host_step_answers.json").read_text())
cost = load_step_cost(host_step.DEFAULT_COST)
model = load_model("smollm2").model
flush = torch.ones(100 * (1 << 18))
for m in sys.argv[1:]:
    best = None
    for _ in range(3):
        spent.clear()
        r = host_step.run_method(model, m, [[p] for p in saved["prompts"]], saved["answers"], 128, cost, True, flush)
        if best is None or r["host"] < best[0]["host"]:
            best = (r, dict(spent))
    r, t = best
    calls = " ".join(f"{k} {v / r['steps'] * 1e3:.3f}" for k, v in t.items())
    print(f"{m}: host {r['host']:.3f} ms a step; {calls}; planner {sum(t.values()) / r['steps'] * 1e3:.3f}", flush=True)
