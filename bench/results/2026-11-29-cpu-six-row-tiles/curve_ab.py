"""measure_step_cost as before (the fastest of each point's rounds) against pairs and medians, alternated in one
process, 4 times each: the curves (ms at each grid point), per_seq_ms, the long curve."""

import importlib.util
import sys
import time

sys.path.insert(0, ".")
from models.loader import load_model
import models.cost as now

spec = importlib.util.spec_from_file_location("cost_before", sys.argv[1])
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
m = load_model("smollm2").model
for i in range(4):
    for name, mod in (("before", before), ("now", now)):
        t = time.perf_counter()
        c = mod.measure_step_cost(m)
        dt = time.perf_counter() - t
        print(
            f"{name:6s} ({dt:.1f} s): "
            + " ".join(f"{T}:{v:.1f}" for T, v in zip(c.tokens, c.ms))
            + f" | per_seq {c.per_seq_ms:.2f} | long "
            + " ".join(f"{v:.1f}" for v in c.long_ms),
            flush=True,
        )
