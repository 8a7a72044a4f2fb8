"""The skinny attention over 30 layers' pools of 512 keys (SmolLM2's 9 query and 3 kv heads of
64), the caches flushed every 10 layers: from memory, and with each layer's keys and values read
just before (that read timed apart). Median of 15 rounds; run from the repository root under the
lock."""
import sys
import time

import torch

sys.path.insert(0, ".")
from kernels import skinny  # noqa: E402

BS, L, LAYERS, H, KV, D = 16, 512, 30, 9, 3, 64
junk = torch.empty(64 * 1024 * 1024 // 4)
nb = (L + BS) // BS + 1
pools = [(torch.randn(nb, BS, KV, D), torch.randn(nb, BS, KV, D)) for _ in range(LAYERS)]
blocks = torch.arange(nb, dtype=torch.int32)


def run(t, warm, reps=15):
    q = torch.randn(t, H, D)
    res, pre = [], []
    for _ in range(reps):
        tot = ptot = 0.0
        for i in range(LAYERS):
            if i % 10 == 0:
                junk[::16].add_(1.0)
            k, v = pools[i]
            if warm:
                t0 = time.perf_counter()
                k.sum()
                v.sum()
                ptot += time.perf_counter() - t0
            t0 = time.perf_counter()
            skinny.attention_unchecked(q, k, v, blocks, L, None, True, 0.125, 2)
            tot += time.perf_counter() - t0
        res.append(tot)
        pre.append(ptot)
    res.sort()
    pre.sort()
    return res[len(res) // 2] * 1e3, pre[len(pre) // 2] * 1e3


for t in (1, 8):
    print(t, "cold %.3f" % run(t, False)[0], "after a read: attention %.3f (read %.3f)" % run(t, True))
