"""The prefill kernel (kernels/skinny.py ``prefill_attention``) against torch's SDPA on one layer
of the default model's shape (9 query heads, 3 kv heads, head dim 64), fp32, on paged caches
with shuffled blocks; the error of each against the float64 reference. Best of 5 per point,
the two interleaved.

    python bench/results/2026-11-27-cpu-prefill-kernel/kernel_ab.py --threads 1,2
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels import skinny  # noqa: E402

H, KV, D, BS = 9, 3, 64, 16
POINTS = [(128, 0), (512, 0), (1000, 0), (2000, 0), (100, 700), (300, 700), (1000, 700)]  # (rows, prefix)


def best_ms(f, n=5):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return min(out) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    print(f"build: {skinny.build_tag()}")
    print("| threads | rows | prefix | ours ms | SDPA ms | SDPA / ours | ours GFLOP/s | max err ours | max err SDPA |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        for t, prefix in POINTS:
            g = torch.Generator().manual_seed(t + prefix)
            L = t + prefix
            n = -(-L // BS)
            kc, vc = torch.randn(n + 3, BS, KV, D, generator=g), torch.randn(n + 3, BS, KV, D, generator=g)
            ids = torch.randperm(n + 3, generator=g)[:n].int()
            q = torch.randn(t, H, D, generator=g)
            k = kc[ids.long()].reshape(-1, KV, D)[:L].transpose(0, 1)[None].contiguous()
            v = vc[ids.long()].reshape(-1, KV, D)[:L].transpose(0, 1)[None].contiguous()
            qs = q.transpose(0, 1)[None]
            mask = None if prefix == 0 else torch.ones(t, L, dtype=torch.bool).tril(diagonal=prefix)

            def ours():
                return skinny.prefill_attention(q, kc, vc, ids, L, threads=threads)

            def sdpa(dt=torch.float32):
                return F.scaled_dot_product_attention(qs.to(dt), k.to(dt), v.to(dt), attn_mask=mask,
                                                      is_causal=mask is None, enable_gqa=True)[0].transpose(0, 1)

            ref = sdpa(torch.float64)
            e1, e2 = (ours() - ref).abs().max().item(), (sdpa() - ref).abs().max().item()
            a, b = best_ms(ours), best_ms(sdpa)
            a, b = min(a, best_ms(ours)), min(b, best_ms(sdpa))
            flops = 4 * H * D * (t * prefix + t * (t + 1) / 2)
            print(f"| {threads} | {t} | {prefix} | {a:.2f} | {b:.2f} | {b / a:.2f} | {flops / a / 1e6:.0f} | "
                  f"{e1:.1e} | {e2:.1e} |", flush=True)


if __name__ == "__main__":
    main()
