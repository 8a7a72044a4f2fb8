"""skinny_attention on fixed random inputs (fp32 and fp16 pools; masks, the causal rule, none; head
sizes 8 to 128) saved to the file argv[1]: run on two checkouts and compare the files bit for bit."""
import sys

import torch

from kernels import skinny

SHAPES = [  # T, H, KV, D, L, pool dtype, rule
    (1, 9, 3, 64, 512, torch.float16, "none"), (8, 9, 3, 64, 512, torch.float16, "causal"),
    (8, 9, 3, 64, 700, torch.float16, "mask"), (5, 8, 8, 64, 130, torch.float32, "mask"),
    (16, 12, 2, 128, 300, torch.float32, "causal"), (3, 4, 1, 40, 77, torch.float32, "none"),
    (7, 6, 2, 96, 257, torch.float16, "mask"), (2, 14, 2, 64, 1500, torch.float16, "causal"),
    (33, 9, 3, 64, 600, torch.float16, "mask"), (4, 2, 2, 8, 20, torch.float32, "mask")]
torch.manual_seed(0)
outs = []
for T, H, KV, D, L, dt, kind in SHAPES:
    bs = 16
    nblk = (L + bs - 1) // bs + 3
    kc = torch.randn(nblk, bs, KV, D).to(dt)
    vc = torch.randn(nblk, bs, KV, D).to(dt)
    blocks = torch.randperm(nblk)[: (L + bs - 1) // bs].to(torch.int32)
    q = torch.randn(T, H, D)
    mask = None
    if kind == "mask":
        mask = torch.rand(T, L) < 0.7
        mask[:, : L // 2] = True
    outs.append(skinny.skinny_attention(q, kc, vc, blocks, L, mask=mask, causal=kind == "causal"))
torch.save(outs, sys.argv[1])
print("saved", len(outs))
