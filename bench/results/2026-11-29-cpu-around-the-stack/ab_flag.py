"""A switch of the C library (an int the variant's diff adds: quant_balance, quant_adapt, quant_pairs)
off and on in turn, one forward each, in one process: the default model at the given contexts and
chain step sizes, outputs compared bit for bit first. From the repository root, the diff applied:

    python bench/results/2026-11-29-cpu-around-the-stack/ab_flag.py quant_adapt 320,1024 1,2,4,8 [forwards]
"""

import ctypes
import statistics
import sys
import time

sys.path.insert(0, ".")
import torch
from models.loader import load_model
from models.runner import ModelRunner, StepInput
from kernels import skinny

model = load_model("smollm2").model
lib = skinny._require()
flag = ctypes.c_int.in_dll(lib, sys.argv[1])
for ctx in map(int, sys.argv[2].split(",")):
    runner = ModelRunner(model, cache_tokens=ctx + 200, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, ctx)
    gen = torch.Generator().manual_seed(0)
    for T in map(int, sys.argv[3].split(",")):
        st = runner.prepare([StepInput(0, torch.randint(0, 49152, (T,), generator=gen).tolist(), list(range(T)), None)])
        outs = {}
        for f in (0, 1):
            flag.value = f
            with torch.inference_mode():
                outs[f] = runner._forward_ranked(*st, k=8)
        same = torch.equal(outs[0][0], outs[1][0]) and outs[0][1:] == outs[1][1:]
        res = {0: [], 1: []}
        for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 300):
            f = i % 2
            flag.value = f
            t = time.perf_counter()
            with torch.inference_mode():
                runner.forward_greedy(*st)
            res[f].append((time.perf_counter() - t) * 1e3)
        m0, m1 = statistics.median(res[0][10:]), statistics.median(res[1][10:])
        print(
            f"ctx {ctx} T={T}: off {m0:.3f} (min {min(res[0]):.3f})  on {m1:.3f} (min {min(res[1]):.3f})  "
            f"ratio {m1 / m0:.3f}  identical {same}",
            flush=True,
        )
    runner.free(0)
