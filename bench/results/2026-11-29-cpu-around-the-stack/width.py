"""T=1 vs T=2 (chain) forwards at one context, in different orders, one process."""

import statistics
import sys
import time

sys.path.insert(0, ".")
import torch
from models.loader import load_model
from models.runner import ModelRunner, StepInput

model = load_model("smollm2").model
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 300
runner = ModelRunner(model, cache_tokens=ctx + 200, block_size=16)
runner.add_sequence(0)
runner.assume_context(0, ctx)
gen = torch.Generator().manual_seed(0)


def chain(T):
    toks = torch.randint(0, 49152, (T,), generator=gen).tolist()
    return runner.prepare([StepInput(0, toks, list(range(T)), None)])


steps = {T: chain(T) for T in (1, 2, 3, 4, 8)}
flush = torch.empty(64 * 1024 * 1024 // 4)


def run(T, cold=False):
    if cold:
        flush.fill_(1.0)
    t = time.perf_counter()
    with torch.inference_mode():
        runner.forward_greedy(*steps[T])
    return (time.perf_counter() - t) * 1e3


for _ in range(20):
    run(1)
    run(2)
res = {}
for order in ("blocks", "alt", "alt-cold", "blocks"):
    for T in (1, 2, 3, 4, 8):
        res.setdefault((order, T), [])
    for rep in range(3):
        if order == "blocks":
            for T in (1, 2, 3, 4, 8):
                res[(order, T)] += [run(T) for _ in range(30)]
        else:
            for _ in range(30):
                for T in (1, 2, 3, 4, 8):
                    res[(order, T)].append(run(T, cold=order.endswith("cold")))
for (order, T), v in res.items():
    print(f"{order:9s} T={T}: median {statistics.median(v):6.2f} min {min(v):6.2f} ms")
