"""quant_linear with the AMX path on and off (kernels/cpu/quant_gemm.c with amx_path.diff applied), interleaved."""
import time
import torch
import sys
from kernels import skinny, quant
lib = skinny._require()
torch.manual_seed(0)
shapes = [("qkv", 960, 576, quant.quantize_q4_1), ("gate_up", 3072, 576, quant.quantize_q4_1),
          ("down", 576, 1536, quant.quantize_q4_1), ("head", 49152, 576, quant.quantize_q8_0)]
ms = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2, 3, 4, 6, 8, 12, 16, 32, 64]
print("shape M vnni_us amx_us amx/vnni")
for name, n, k, q in shapes:
    w = q(torch.randn(n, k))
    for m in ms:
        x = torch.randn(m, k)
        best = {}
        for rnd in range(3):
            for on in (0, 1):
                lib.quant_amx_enable(on)
                reps = max(5, int(2000 / (m + 4) * 576 * 576 / (n * k)))
                t0 = time.perf_counter()
                for _ in range(reps):
                    quant.quant_linear(x, w)
                dt = (time.perf_counter() - t0) / reps * 1e6
                best[on] = min(best.get(on, 1e18), dt)
        print(f"{name} {m} {best[0]:.1f} {best[1]:.1f} {best[1]/best[0]:.2f}", flush=True)
lib.quant_amx_enable(1)
