"""A step's greedy walks after 100 MB written (the caches as a forward leaves them): greedy_path per
sequence (the reference) against glue.paths, batches of 1 and 8 random trees; and the step clock's
7 marks, the Python method against the C ones of glue_mark.diff (timed only where that diff is
applied: the code at this commit has no glue.mark). Alternated, 300 rounds, median and p25 in us.

    python bench/results/2026-11-29-cpu-greedy-walks/cold_calls.py
"""
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from decoding import compiled  # noqa: E402
from decoding.generate import send  # noqa: E402
from decoding.stats import PHASES, StepClock  # noqa: E402
from decoding.verify import greedy_path  # noqa: E402
from test_compiled import random_tree  # noqa: E402
from test_compiled_step import closed_subset, reduced_following  # noqa: E402

glue = compiled.glue()
buf = torch.empty(100 * 2**20 // 4)
rng = random.Random(0)
batches = {}
for B in (1, 8):
    trees = [random_tree(rng) for _ in range(B)]
    sent, rows, _ = send(list(range(B)), trees, [closed_subset(rng, t) for t in trees])
    batches[B] = (sent, rows, reduced_following(rng, sent, rows))
kinds = ["paths py 1", "paths c 1", "paths py 8", "paths c 8"]
if hasattr(glue, "mark"):
    kinds += ["mark py", "mark c", "mark direct"]
res = {k: [] for k in kinds}
clk = StepClock()
for _ in range(300):
    for k in kinds:
        buf.add_(1.0)  # 100 MB read and written
        if k.startswith("mark"):
            clk.start(None)
            t0 = time.perf_counter()
            for p in PHASES:
                if k == "mark py":
                    StepClock.mark(clk, p)
                elif k == "mark c":
                    clk.mark(p)
                else:
                    glue.mark(StepClock.mark, clk, p)
        else:
            sent, rows, red = batches[int(k[-1])]
            t0 = time.perf_counter()
            if " py " in k:
                v = [greedy_path(t, r, top1) for t, r, (_, top1, _) in zip(sent, rows, red)]
            else:
                v = glue.paths(sent, rows, red)
        res[k].append(time.perf_counter() - t0)
for k, v in res.items():
    print(f"{k:12s} median {statistics.median(v) * 1e6:7.2f} us  p25 {statistics.quantiles(v, n=4)[0] * 1e6:7.2f}")
