"""Why a decoding step of few rows after a long prefix stays on the skinny kernel: the two
kernels on the same causal step (T rows, the last T of L keys), 30 layers' caches so that the
keys come from memory, the default model's shape, fastest of 5, two interleaved rounds.

    python bench/results/2026-11-27-cpu-prefill-kernel/few_rows.py --threads 1
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels import skinny  # noqa: E402

H, KV, D, BS = 9, 3, 64, 16


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; ms for 30 layers")
    print("| keys | rows | skinny | prefill kernel | prefill / skinny |")
    print("|---:|---:|---:|---:|---:|")
    for L in (256, 1450):
        for t in (1, 4, 8, 16):
            n = -(-L // BS)
            caches = [(torch.randn(n, BS, KV, D), torch.randn(n, BS, KV, D)) for _ in range(30)]
            ids = torch.arange(n, dtype=torch.int32)
            q = torch.randn(t, H, D)

            def sk():
                for kc, vc in caches:
                    skinny.attention_unchecked(q, kc, vc, ids, L, None, True, D ** -0.5)

            def pf():
                for kc, vc in caches:
                    skinny.prefill_unchecked(q, kc, vc, ids, L, D ** -0.5)

            best = {}
            for name, f in (("skinny", sk), ("prefill", pf)) * 2:
                f()
                for _ in range(5):
                    t0 = time.perf_counter()
                    f()
                    best[name] = min(best.get(name, float("inf")), (time.perf_counter() - t0) * 1e3)
            print(f"| {L} | {t} | {best['skinny']:.2f} | {best['prefill']:.2f} | "
                  f"{best['prefill'] / best['skinny']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
