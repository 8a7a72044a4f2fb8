"""The skinny attention over fp32 and fp16 pools: 30 layers' pools (SmolLM2's 9 query and 3 kv
heads of 64), the caches flushed every 10 layers; "cold": from memory, "warm": each layer's pools
read just before. Median of 11 rounds, ms for the 30 layers. Run from the repository root under
the lock."""
import sys
import time

import torch

sys.path.insert(0, ".")
from kernels import skinny  # noqa: E402

BS, LAYERS, H, KV, D = 16, 30, 9, 3, 64
junk = torch.empty(64 * 1024 * 1024 // 4)


def run(t, length, dtype, warm, reps=11):
    nb = (length + BS) // BS + 1
    pools = [(torch.randn(nb, BS, KV, D).to(dtype), torch.randn(nb, BS, KV, D).to(dtype)) for _ in range(LAYERS)]
    blocks = torch.arange(nb, dtype=torch.int32)
    q = torch.randn(t, H, D)
    res = []
    for _ in range(reps):
        tot = 0.0
        for i in range(LAYERS):
            if i % 10 == 0:
                junk[::16].add_(1.0)
            k, v = pools[i]
            if warm:
                k.sum()
                v.sum()
            t0 = time.perf_counter()
            skinny.attention_unchecked(q, k, v, blocks, length, None, True, 0.125, 2)
            tot += time.perf_counter() - t0
        res.append(tot)
    res.sort()
    return res[len(res) // 2] * 1e3


for length in (512, 1500):
    for t in (1, 4, 8, 16):
        cells = [f"{run(t, length, dt, warm):.3f}" for warm in (False, True) for dt in (torch.float32, torch.float16)]
        print(f"keys {length} rows {t}: cold fp32 {cells[0]} fp16 {cells[1]} | warm fp32 {cells[2]} fp16 {cells[3]} ms")
