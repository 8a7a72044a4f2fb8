"""The planner's curves for the emulated runs (emulated.sh): the forwards take the steep-state
curve's time (bench/data/step_cost_steep.json, slower than this machine at every step size), the
planner plans with that curve as it is (exact), x 1.35 at every step size (measured in a slower
state of the machine: the error a multiple of the cost), or x 1.35 at one token tapering to x 1 at
12 tokens and over (one-token steps overpriced most, as the loop found them against its curve:
loop_cost.txt). Writes curves/*.json."""
import json
from pathlib import Path

HERE = Path(__file__).parent
steep = json.loads((HERE.parents[1] / "data" / "step_cost_steep.json").read_text())
TAPER = {1: 1.35, 2: 1.3, 3: 1.25, 4: 1.2, 6: 1.12, 8: 1.06}


def scaled(f, why):
    c = dict(steep["cost"])
    ms = [m * f(t) for t, m in zip(c["tokens"], c["ms"])]
    for i in range(1, len(ms)):  # a curve is non-decreasing
        ms[i] = max(ms[i], ms[i - 1])
    long_ms = [m * f(t) for t, m in zip(c["long_tokens"], c["long_ms"])]
    c.update(ms=ms, long_ms=long_ms)
    return {"cost": c, "origin": f"bench/data/step_cost_steep.json {why} (curves.py)"}


for name, f, why in (("exact", lambda t: 1.0, "as it is"), ("slow", lambda t: 1.35, "x 1.35 at every step size"),
                     ("taper", lambda t: TAPER.get(t, 1.0), "x 1.35 at one token tapering to x 1 at 12 tokens")):
    (HERE / "curves" / f"{name}.json").write_text(json.dumps(scaled(f, why), indent=1) + "\n")
