"""Where the CPU tree attention's time goes: kernels/cpu/skinny_attention.c against copies with
one part cut out (their outputs are wrong on purpose; only their times mean something).

    python bench/results/2026-11-26-cpu-roofline-fast/attention_parts.py [ROWS]   (e.g. 1,8,16,64)

The default model's attention shape (9 query heads, 3 kv heads, head dim 64), 512 committed keys
plus the step's rows under a random tree mask, 30 layers' caches in turn (each in its own
memory), 2 threads, the AVX-512 build's compiler flags, best of 7 rounds, variants interleaved.
"""

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "kernels" / "cpu"
FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-mavx2", "-mfma", "-mavx512f",
         "-mavx512dq", "-mavx512bw", "-mavx512vl", f"-I{SRC}"]
NO_MERGE = ("for (int64_t r = 0; r < (int64_t)T * H; r++) {\n        float mx",
            "for (int64_t r = 0; r < (int64_t)T * H * 0; r++) {\n        float mx")
NO_QK = ("qk_4(sc, c, qp, kp + c, D);",
         "for (int ii = 0; ii < QB; ii++) for (int cc = 0; cc < 4; cc++) sc[ii][c + cc] = 0.1f * cc;")
NO_PV = [("for (; d0 + 32 <= D; d0 += 32) pv_4(", "for (; d0 + 32 <= D && 0; d0 += 32) pv_4("),
         ("for (; d0 < D; d0 += 8) pv_1(", "for (; d0 < D && 0; d0 += 8) pv_1(")]
SOFTMAX = ("        for (int i = 0; i < QB; i++) {\n            const int t = (q0 + (i < nq ? i : 0)) / G;",
           "        /* the weighted sums: into a buffer")


def variants(src: str) -> dict[str, str]:
    def cut(s, pairs):
        for old, new in pairs:
            assert old in s, old[:40]
            s = s.replace(old, new)
        return s

    a, b = src.index(SOFTMAX[0]), src.index(SOFTMAX[1])
    products_only = cut(src[:a] + "        for (int i = 0; i < QB; i++) live[i] = 1;\n" + src[b:], [NO_MERGE])
    return {"kernel": src, "without QK": cut(src, [NO_QK]), "without PV": cut(src, NO_PV),
            "only QK and PV": products_only, "neither": cut(products_only, [NO_QK] + NO_PV)}


def build(name: str, src: str, tmp: Path):
    c, so = tmp / f"{len(list(tmp.iterdir()))}.c", tmp / f"{len(list(tmp.iterdir()))}.so"
    c.write_text(src)
    subprocess.run(["gcc", *FLAGS, str(c), "-o", str(so), "-lm"], check=True)
    f = ctypes.CDLL(str(so)).skinny_attention
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p,
                  ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return f


def call(f, q, kc, vc, blocks, L, mask, out):
    T, H, D = q.shape
    assert f(q.data_ptr(), q.stride(0), T, H, kc.shape[2], D, kc.data_ptr(), vc.data_ptr(), blocks.data_ptr(),
             kc.shape[1], L, mask.data_ptr(), 0, D ** -0.5, out.data_ptr(), 2) == 0


def main() -> None:
    rows = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,8,16,64").split(",")]
    with tempfile.TemporaryDirectory() as d:
        fs = {n: build(n, s, Path(d)) for n, s in variants((SRC / "skinny_attention.c").read_text()).items()}
        torch.manual_seed(0)
        H, KV, D, bs, layers, ctx = 9, 3, 64, 16, 30, 512
        nblk = (ctx + 64) // bs + 1
        caches = [(torch.randn(nblk, bs, KV, D), torch.randn(nblk, bs, KV, D), torch.randperm(nblk).to(torch.int32))
                  for _ in range(layers)]
        print("| step rows | " + " | ".join(fs) + " |")
        for T in rows:
            q, L = torch.randn(T, H, D), ctx + T
            mask = torch.zeros(T, L, dtype=torch.bool)
            mask[:, :ctx] = True
            parent = [-1] + [int(torch.randint(0, i, (1,))) for i in range(1, T)]
            for i in range(T):
                j = i
                while j >= 0:
                    mask[i, ctx + j] = True
                    j = parent[j]
            out = torch.empty(T, H, D)
            best = {n: float("inf") for n in fs}
            for _ in range(7):
                for n, f in fs.items():
                    t0 = time.perf_counter()
                    for kc, vc, blocks in caches:
                        call(f, q, kc, vc, blocks, L, mask, out)
                    best[n] = min(best[n], time.perf_counter() - t0)
            print(f"| {T} | " + " | ".join(f"{best[n] * 1e3:.2f} ms" for n in fs) + " |", flush=True)


if __name__ == "__main__":
    main()
