"""The quantized products (Q4_1 shapes of the default model's layers, Q8_0 its head's) of two builds
of the CPU library (argv: NAME=PATH.so ...) in one process, calls alternated: per shape and rows the
median over 7 rounds of each build's fastest of 5 x 20 calls (us), 2 threads; and whether the builds'
outputs are equal bit for bit. Run from the repository root."""
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
for N, K, name, pack in ((960, 576, "qkv", quant.quantize_q4_1), (3072, 576, "gate_up", quant.quantize_q4_1),
                         (576, 1536, "down", quant.quantize_q4_1), (49152, 576, "head q8_0", quant.quantize_q8_0)):
    w = pack(torch.randn(N, K) * 0.05)
    for M in (1, 4, 8, 16):
        x = torch.randn(M, K)
        res = {n: [] for n in libs}
        outs = {}
        for _ in range(7):
            for n, lib in libs.items():
                best = 1e9
                for _ in range(5):
                    calls = 20 if N < 10000 else 2
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        y = quant.linear_unchecked(lib, x, w, None, 2)
                    best = min(best, (time.perf_counter() - t0) / calls)
                res[n].append(best * 1e6)
                outs[n] = y
        med = {n: statistics.median(v) for n, v in res.items()}
        base = list(libs)[0]
        same = all(torch.equal(outs[base], o) for o in outs.values())
        print(f"{name:9s} M {M:3d} " + " ".join(f"{n} {med[n]:8.1f} us ({med[n] / med[base]:.2f})" for n in libs)
              + f" equal {same}", flush=True)
