"""One layer's prefill attention of the default model's shape (9 query heads, 3 kv heads, head_dim
64, fp32, paged cache of 16-token blocks) on this CPU: SDPA as the forward runs it now (causal for a
prompt in one chunk, a (T, L) mask after a prefix) against the skinny C kernel with its causal rule,
over all T rows at once and in slices of 64 / 128 rows. Best of 3 after a warm-up, all threads.

    python bench/results/2026-11-26-cpu-prefill-attention/prefill_attention.py
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels import skinny  # noqa: E402

H, KV, D, BS = 9, 3, 64, 16


def setup(prefix, rows):
    length = prefix + rows
    nb = -(-length // BS) + 2
    kc, vc = torch.randn(nb, BS, KV, D), torch.randn(nb, BS, KV, D)
    return torch.randn(rows, H, D), kc, vc, torch.arange(nb, dtype=torch.int32), length


def sdpa(q, kc, vc, length, prefix):
    k = kc.reshape(-1, KV, D)[:length].transpose(0, 1)[None]
    v = vc.reshape(-1, KV, D)[:length].transpose(0, 1)[None]
    qs = q.transpose(0, 1)[None]
    f = torch.nn.functional.scaled_dot_product_attention
    if prefix == 0:
        o = f(qs, k, v, is_causal=True, scale=D ** -0.5, enable_gqa=True)
    else:
        mask = torch.ones(q.shape[0], length, dtype=torch.bool).tril(diagonal=prefix)
        o = f(qs, k, v, attn_mask=mask, scale=D ** -0.5, enable_gqa=True)
    return o[0].transpose(0, 1)


def skinny_causal(q, kc, vc, ids, length, rows=None):
    T = q.shape[0]
    rows = rows or T
    outs = [skinny.attention_unchecked(q[s:s + rows].contiguous(), kc, vc, ids, length - T + min(s + rows, T), None,
                                       True, D ** -0.5) for s in range(0, T, rows)]
    return torch.cat(outs)


def best_ms(f, n=3):
    f()
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


if __name__ == "__main__":
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; ms per layer (x 30 layers for the model)")
    print("| prefix | rows | max abs diff | SDPA | skinny, all rows | skinny, 64-row slices | skinny, 128-row slices |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for prefix, rows in ((0, 256), (0, 512), (0, 2000), (1536, 512), (1792, 256)):
        q, kc, vc, ids, length = setup(prefix, rows)
        err = (sdpa(q, kc, vc, length, prefix) - skinny_causal(q, kc, vc, ids, length)).abs().max().item()
        t = [best_ms(lambda: sdpa(q, kc, vc, length, prefix))]
        t += [best_ms(lambda r=r: skinny_causal(q, kc, vc, ids, length, r)) for r in (None, 64, 128)]
        print(f"| {prefix} | {rows} | {err:.1e} | " + " | ".join(f"{x:.1f}" for x in t) + " |", flush=True)
