"""One quantized product (kernels/quant.py) against the fp32 skinny product on the default
model's shapes (SmolLM2-135M: d 576, 9 heads of 64, 3 kv heads, MLP 1536, vocabulary 49152), at
1-64 rows. Each weight is held in enough copies (>= 256 MB of each form) that a pass over them
streams from memory, as a decoding step's weights do; ms per product = the fastest of 5 passes
over the copies / copies, the two forms interleaved in two rounds. GB/s counts the weight bytes
the product reads (fp32: 4 a weight; Q4_1: 20 bytes a block of 32; Q8_0: 34).

    flock /tmp/timing.lock python bench/results/2026-11-27-cpu-quant/products.py --threads 2
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels import quant, skinny  # noqa: E402

SHAPES = [("qkv", 960, 576, "q4_1"), ("o", 576, 576, "q4_1"), ("gate_up", 3072, 576, "q4_1"),
          ("down", 576, 1536, "q4_1"), ("gate_up", 3072, 576, "q8_0"), ("head", 49152, 576, "q8_0")]
ROWS = (1, 4, 8, 16, 64)
STREAM = 256e6  # bytes of copies per form


def timed(f, copies: int) -> float:
    f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best / copies


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, build {skinny.isa()} (VNNI: {quant.vnni()}), load average {os.getloadavg()[0]:.1f}")
    print("| product | N x K | format | rows | fp32 ms | fp32 GB/s | quant ms | quant GB/s | fp32 / quant |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name, n, k, fmt in SHAPES:
        g = torch.Generator().manual_seed(n + k)
        w = torch.randn(n, k, generator=g) * 0.05
        qw = quant.quantize_q4_1(w) if fmt == "q4_1" else quant.quantize_q8_0(w)
        fb, qb = n * k * 4, qw.nbytes
        fws = [w.clone() for _ in range(max(2, round(STREAM / fb)))]
        qws = [quant.QuantWeight(qw.format, qw.data.clone(), qw.n)
               for _ in range(max(2, round(STREAM / qb)))]
        for m in ROWS:
            x = torch.randn(m, k, generator=g)
            best = {}
            for form in ("fp32", "quant") * 2:
                if form == "fp32":
                    t = timed(lambda: [skinny.skinny_linear(x, fw) for fw in fws], len(fws))
                else:
                    t = timed(lambda: [quant.quant_linear(x, q) for q in qws], len(qws))
                best[form] = min(best.get(form, float("inf")), t)
            tf, tq = best["fp32"], best["quant"]
            print(f"| {name} | {n} x {k} | {fmt} | {m} | {tf * 1e3:.3f} | {fb / tf / 1e9:.1f} | {tq * 1e3:.3f} | "
                  f"{qb / tq / 1e9:.1f} | {tf / tq:.2f} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
