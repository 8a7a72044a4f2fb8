"""The quantized LM head (Q8_0, 49152 x 576) with the argmax / top-k after it (quant_linear, then
kernels.rows) against the head ranking its own logits (quant_linear_topk), each call cold (a 128 MB
buffer written before it): rows x k. Median of 30 alternated calls.

    python head_alone.py
"""
import sys
import time

import torch

sys.path.insert(0, '.')
from kernels import quant, rows
torch.manual_seed(0)
w = quant.quantize_q8_0(torch.randn(49152, 576))
junk = torch.randn(32 * 1024 * 1024 // 4 * 4)  # 128 MB to evict the caches
def flush(): junk.add_(1.0)
for m, k in ((1, 1), (5, 1), (5, 8), (12, 8)):
    x = torch.randn(m, 576)
    res = {"sep": [], "fused": []}
    for rep in range(30):
        for name in ("sep", "fused"):
            flush()
            t = time.perf_counter()
            if name == "sep":
                y = quant.quant_linear(x, w)
                a = rows.argmax_topk_rows(y, k) if k > 1 else rows.argmax_rows(y)
            else:
                y, a, b = quant.quant_linear_topk(x, w, k)
            res[name].append(time.perf_counter() - t)
    print(m, k, {n: "%.1f us" % (sorted(v)[len(v)//2] * 1e6) for n, v in res.items()})
