"""us per skinny_attention call (the fastest of 300): smollm2's heads (9, 3 kv, D 64), fp16 pools,
1-16 causal rows over 512 keys. Run from a checkout's root with PYTHONPATH set to it (ab.sh)."""
import time

import torch

from kernels import skinny

torch.manual_seed(0)
res = []
for T in (1, 2, 4, 8, 16):
    L, bs = 512, 16
    kc = torch.randn(L // bs + 1, bs, 3, 64).half()
    vc = torch.randn(L // bs + 1, bs, 3, 64).half()
    blocks = torch.arange(L // bs, dtype=torch.int32)
    q = torch.randn(T, 9, 64)
    best = 1e9
    for _ in range(300):
        t0 = time.perf_counter()
        skinny.skinny_attention(q, kc, vc, blocks, L, causal=True)
        best = min(best, time.perf_counter() - t0)
    res.append(f"{T}:{best * 1e6:.1f}")
print(" ".join(res))
