"""The default model's Q4_1 layer products alone (kernels/quant.py), 1-16 rows, weights streamed
from memory (copies of each weight, >= 256 MB in all), from the repository given as argv[1]: run once
on the code before a change and once after it, alternated (products_bcast.txt: three rounds each,
before = this session's start code, after = it with products_bcast.patch applied).

    flock /tmp/timing.lock .venv/bin/python bench/results/2026-11-28-cpu-host-split/products_bcast.py ROOT
"""
import sys
import time

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from kernels import quant  # noqa: E402

SHAPES = [("qkv", 960, 576, "q4_1"), ("o", 576, 576, "q4_1"), ("gate_up", 3072, 576, "q4_1"),
          ("down", 576, 1536, "q4_1")]
ROWS = (1, 2, 4, 8, 16)
STREAM = 256e6


def timed(f, copies: int) -> float:
    f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best / copies


def main():
    torch.set_num_threads(2)
    for name, n, k, fmt in SHAPES:
        g = torch.Generator().manual_seed(n + k)
        w = torch.randn(n, k, generator=g) * 0.05
        qw = quant.quantize_q4_1(w) if fmt == "q4_1" else quant.quantize_q8_0(w)
        qws = [quant.QuantWeight(qw.format, qw.data.clone(), qw.n) for _ in range(max(2, round(STREAM / qw.nbytes)))]
        for m in ROWS:
            x = torch.randn(m, k, generator=g)
            t = min(timed(lambda: [quant.quant_linear(x, q) for q in qws], len(qws)) for _ in range(2))
            print(f"{name} {fmt} rows {m}: {t * 1e3:.4f} ms  {2 * n * k * m / t / 1e9:.0f} GOP/s", flush=True)


if __name__ == "__main__":
    main()
