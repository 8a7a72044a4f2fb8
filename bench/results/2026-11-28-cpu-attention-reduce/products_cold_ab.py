"""The Q4_1 products over 30 weight matrices of one shape, cycled (each call's weights last touched 29
calls ago: out of L2, as in a forward), builds of the CPU library alternated in one process (argv:
NAME=PATH.so ...): per shape and rows the median over 7 rounds of each build's fastest of 3 x 60
calls (us), 2 threads. Run from the repository root."""
import ctypes
import statistics
import sys
import time

import torch

from kernels import quant, skinny

skinny._load()
libs = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=")
    libs[name] = ctypes.CDLL(path)
    skinny._declare(libs[name])
torch.manual_seed(0)
for N, K, shape in ((3072, 576, "gate_up"), (576, 1536, "down"), (960, 576, "qkv")):
    ws = [quant.quantize_q4_1(torch.randn(N, K) * 0.05) for _ in range(30)]
    for M in (1, 8):
        x = torch.randn(M, K)
        res = {n: [] for n in libs}
        for _ in range(7):
            for n, lib in libs.items():
                best = 1e9
                for _ in range(3):
                    t0 = time.perf_counter()
                    for _ in range(2):
                        for w in ws:
                            quant.linear_unchecked(lib, x, w, None, 2)
                    best = min(best, (time.perf_counter() - t0) / 60)
                res[n].append(best * 1e6)
        med = {n: statistics.median(v) for n, v in res.items()}
        base = list(libs)[0]
        print(f"{shape:8s} M{M:3d} " + " ".join(f"{n} {med[n]:6.1f}us ({med[n] / med[base]:.2f})" for n in libs),
              flush=True)
