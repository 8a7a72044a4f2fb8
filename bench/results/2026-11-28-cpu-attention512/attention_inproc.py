"""The decoding attention of two builds of the library (argv[1]: before, argv[2]: now, the .so files
kernels/cbuild.py left in ~/.cache/specdec/kernels/) in one process, calls alternated: per rule the
median over 15 rounds of each build's fastest of 20 calls (us), smollm2's heads, fp16 pools, causal
rows over L keys, and whether the two builds' outputs are equal bit for bit."""
import ctypes
import statistics
import sys
import time

import torch

from kernels import skinny

skinny._load()
libs = {}
for name, path in (("before", sys.argv[1]), ("now", sys.argv[2])):
    lib = ctypes.CDLL(path)
    skinny._declare(lib)
    libs[name] = lib
torch.manual_seed(0)
for L in (512, 1500):
    for T in (1, 4, 8, 16):
        bs = 16
        kc = torch.randn(L // bs + 1, bs, 3, 64).half()
        vc = torch.randn(L // bs + 1, bs, 3, 64).half()
        blocks = torch.arange(L // bs + 1, dtype=torch.int32)
        q = torch.randn(T, 9, 64)
        best = {k: [] for k in libs}
        outs = {}
        for rnd in range(15):
            for name, lib in libs.items():
                skinny._lib = lib
                b = 1e9
                for _ in range(20):
                    t0 = time.perf_counter()
                    o = skinny.skinny_attention(q, kc, vc, blocks, L, causal=True)
                    b = min(b, time.perf_counter() - t0)
                best[name].append(b * 1e6)
                outs[name] = o
        same = torch.equal(outs["before"], outs["now"])
        mb, mn = statistics.median(best["before"]), statistics.median(best["now"])
        print(f"L {L} T {T}: before {mb:.1f} us, now {mn:.1f} us, now/before {mn / mb:.2f}, equal {same}", flush=True)
