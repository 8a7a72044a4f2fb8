"""Quantized products on cold weights: 30 Q4_1 weights of one shape, the caches flushed every 10
calls (as a step's other weights flush them), median of 15 rounds. Run from the repository root
under the lock; the panel prefetch distance was changed in kernels/cpu/quant_gemm.c (QPF)
between runs."""
import sys
import time

import torch

sys.path.insert(0, ".")
from kernels import quant, skinny  # noqa: E402

lib = skinny._require()
torch.manual_seed(0)
LAYERS = 30
junk = torch.empty(64 * 1024 * 1024 // 4)


def run(n, k, m=1, reps=15):
    ws = [quant.quantize_q4_1(torch.randn(n, k)) for _ in range(LAYERS)]
    x = torch.randn(m, k)
    res = []
    for _ in range(reps):
        tot = 0.0
        for i in range(LAYERS):
            if i % 10 == 0:
                junk[::16].add_(1.0)
            t0 = time.perf_counter()
            quant.linear_unchecked(lib, x, ws[i], None, 2)
            tot += time.perf_counter() - t0
        res.append(tot)
    res.sort()
    ms = res[len(res) // 2] * 1e3
    return ms, LAYERS * ws[0].data.numel() / 1e6


for n, k in [(3072, 576), (576, 1536), (960, 576), (576, 576)]:
    for m in (1, 8):
        ms, mb = run(n, k, m)
        print(n, k, m, f"{ms:.3f} ms {mb:.1f} MB {mb / ms:.1f} GB/s  per call {ms * 1000 / LAYERS:.1f} us")
