"""The quantized products of a prefill chunk with two builds of the CPU library (argv: A=PATH.so
B=PATH.so [ROWS, default 512]): layer 0's Q4_1 weights of the default model (its QuantWeight
objects), x random (ROWS, K), 2 threads; 100 pairs per weight, the builds alternated call by call in
ABBA order. Prints per weight the median and quartiles of B / A and whether the outputs are equal
bit for bit. Run from the repository root."""
import ctypes
import statistics
import sys
import time

import torch

from kernels import quant, skinny
from models.loader import default_model_path, load_model

(na, pa), (nb, pb) = (arg.split("=") for arg in sys.argv[1:3])
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 512
skinny._load()
libs = {na: ctypes.CDLL(pa), nb: ctypes.CDLL(pb)}
for lib in libs.values():
    skinny._declare(lib)
model = load_model(default_model_path(), tune=False, weights="native").model
layer = model.layers[0]
weights = {name: mod.quant for name, mod in layer.named_modules() if isinstance(getattr(mod, "quant", None),
                                                                               quant.QuantWeight)}
gen = torch.Generator().manual_seed(0)
for name, w in weights.items():
    k = w.data.shape[1] * quant.BLOCK
    x = torch.randn(rows, k, generator=gen)
    ratios, same = [], True
    for i in range(100):
        order = (na, nb) if i % 2 == 0 else (nb, na)
        t, y = {}, {}
        for n in order:
            t0 = time.perf_counter()
            y[n] = quant.linear_unchecked(libs[n], x, w, None, 2)
            t[n] = time.perf_counter() - t0
        ratios.append(t[nb] / t[na])
        same = same and torch.equal(y[na], y[nb])
    qs = statistics.quantiles(ratios, n=4)
    print(f"{name} ({w.n} x {k}, {w.format}) M={rows}: {nb} / {na} {qs[1]:.3f} [{qs[0]:.3f}, {qs[2]:.3f}]  "
          f"outputs equal: {same}", flush=True)
