"""The decoding attention of two builds of the CPU library (argv: NAME=PATH.so ...) in one process,
calls alternated: per shape the median over 5 rounds of each build's fastest of 5 x 10 calls (us),
smollm2's heads (9 query, 3 kv, 64 dims), fp16 pools, 2 threads; causal rows, or a tree's mask over
the last T keys; and whether the builds' outputs are equal bit for bit. Run from the repository root."""
import ctypes
import statistics
import sys
import time

import torch

from kernels import skinny

skinny._load()
libs = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=")
    libs[name] = ctypes.CDLL(path)
    skinny._declare(libs[name])
torch.manual_seed(0)


def run(lib, q, kc, vc, blocks, length, mask):
    skinny._lib = lib
    return skinny.attention_unchecked(q, kc, vc, blocks, length, mask, mask is None, 0.125, 2)


for L in (512, 1500):
    for T in (1, 4, 8):
        for mode in ("causal", "tree"):
            if mode == "tree" and T == 1:
                continue
            bs = 16
            kc = torch.randn(L // bs + 1, bs, 3, 64).half()
            vc = torch.randn(L // bs + 1, bs, 3, 64).half()
            blocks = torch.randperm(L // bs + 1).to(torch.int32)
            q = torch.randn(T, 9, 64)
            mask = None
            if mode == "tree":
                mask = torch.ones(T, L, dtype=torch.bool)
                mask[:, L - T:] = (torch.rand(T, T) < 0.5) | torch.eye(T, dtype=torch.bool)
            res = {n: [] for n in libs}
            outs = {}
            for _ in range(5):
                for n, lib in libs.items():
                    best = 1e9
                    for _ in range(5):
                        t0 = time.perf_counter()
                        for _ in range(10):
                            y = run(lib, q, kc, vc, blocks, L, mask)
                        best = min(best, (time.perf_counter() - t0) / 10)
                    res[n].append(best * 1e6)
                    outs[n] = y
            med = {n: statistics.median(v) for n, v in res.items()}
            base = list(libs)[0]
            same = all(torch.equal(outs[base], o) for o in outs.values())
            print(f"L {L:5d} T {T:3d} {mode:6s} " + " ".join(f"{n} {med[n]:7.1f} us ({med[n] / med[base]:.2f})"
                                                         for n in libs) + f" equal {same}", flush=True)
