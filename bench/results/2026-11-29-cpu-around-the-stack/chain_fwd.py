"""A chain step of T tokens (no mask) prepared and forwarded 120 times at contexts 300 and 1,500 (the
default model, batch 1): the median ms of the last 100 (prepare + greedy forward). From the root of the
code to time; run.sh-style alternation of two worktrees gives before / after."""

import statistics
import sys
import time

sys.path.insert(0, ".")
import torch
from models.loader import load_model
from models.runner import ModelRunner, StepInput

model = load_model("smollm2").model
out = []
for ctx in (300, 1500):
    runner = ModelRunner(model, cache_tokens=ctx + 200, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, ctx)
    gen = torch.Generator().manual_seed(0)
    for T in (2, 4, 8):
        toks = torch.randint(0, 49152, (T,), generator=gen).tolist()
        ts = []
        for i in range(120):
            t = time.perf_counter()
            with torch.inference_mode():
                st = runner.prepare([StepInput(0, toks, list(range(T)), None)])
                runner.forward_greedy(*st)
            ts.append((time.perf_counter() - t) * 1e3)
        out.append(f"ctx {ctx} T {T}: {statistics.median(ts[20:]):.3f}")
    runner.free(0)
print(" | ".join(out))
