"""In one process, one forward each in turn: the skinny library built from this checkout's sources
(6-row tiles) against the same library built with quant_gemm.c as it was before (4-row tiles,
``BEFORE``: a copy of that file), swapped as the module's library between forwards. A chain of T
tokens prepared and forwarded greedily at a context (ms, the medians and fastest after 5 warm-up
forwards), then a prefill of 512 tokens, PREFILLS forwards in turn (rounds 0: the prefill alone).
Every output compared bit for bit. From the repository root:
python bench/results/2026-11-29-cpu-six-row-tiles/ab_tiles.py BEFORE.c [rounds [PREFILLS]]"""

import ctypes
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, ".")
import torch  # noqa: E402
from kernels import cbuild, skinny  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402

before_src, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 150
prefills = int(sys.argv[3]) if len(sys.argv) > 3 else 12  # forwards of the prefill, both codes
model = load_model("smollm2").model
now_lib = skinny._require()
isa = skinny._isa
tmp = Path(tempfile.mkdtemp())
sources = []
for src in skinny.SOURCES:  # the same sources, quant_gemm.c as before, in a folder of their own
    dst = tmp / src.name
    shutil.copy(before_src if src.name == "quant_gemm.c" else src, dst)
    sources.append(dst)
for h in skinny.HEADERS:
    shutil.copy(h, tmp / h.name)
path, _ = cbuild.build(
    f"skinny-{isa}-before",
    sources,
    [tmp / h.name for h in skinny.HEADERS],
    skinny.FLAGS + skinny.ISAS[isa][0] + skinny._extra_flags(isa) + [f"-I{tmp}"],
    skinny.LIBS,
)

before_lib = ctypes.CDLL(str(path))
skinny._declare(before_lib)
libs = {"now": now_lib, "before": before_lib}


def forward(runner, toks):
    with torch.inference_mode():
        st = runner.prepare([StepInput(0, toks, list(range(len(toks))), None)])
        return runner._forward_ranked(*st)


for ctx in (300, 1500) if rounds else ():
    runner = ModelRunner(model, cache_tokens=ctx + 200, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, ctx)
    gen = torch.Generator().manual_seed(0)
    for T in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16):
        toks = torch.randint(0, 49152, (T,), generator=gen).tolist()
        res, outs = {"now": [], "before": []}, {}
        for i in range(rounds):
            name = "now" if i % 2 else "before"
            skinny._lib = libs[name]
            t = time.perf_counter()
            o = forward(runner, toks)
            res[name].append((time.perf_counter() - t) * 1e3)
            outs[name] = o
        same = torch.equal(outs["now"][0], outs["before"][0]) and outs["now"][1:] == outs["before"][1:]
        a, b = statistics.median(res["now"][5:]), statistics.median(res["before"][5:])
        fa, fb = min(res["now"]), min(res["before"])
        print(
            f"ctx {ctx} T {T:2d}: median now {a:6.3f} before {b:6.3f} ms, {a / b:.3f}; fastest {fa:6.3f} "
            f"{fb:6.3f}, {fa / fb:.3f}; identical {same}",
            flush=True,
        )
    runner.free(0)

# a prefill of 512 tokens (one chunk), alternated
res, outs = {"now": [], "before": []}, {}
toks = torch.randint(0, 49152, (512,), generator=torch.Generator().manual_seed(1)).tolist()
for i in range(prefills):
    name = "now" if i % 2 else "before"
    skinny._lib = libs[name]
    runner = ModelRunner(model, cache_tokens=700, block_size=16)
    runner.add_sequence(0)
    t = time.perf_counter()
    o = forward(runner, toks)
    res[name].append((time.perf_counter() - t) * 1e3)
    outs[name] = o
    runner.free(0)
same = torch.equal(outs["now"][0], outs["before"][0])
a, b = statistics.median(res["now"][1:]), statistics.median(res["before"][1:])
fa, fb = min(res["now"]), min(res["before"])
print(
    f"prefill 512: median now {a:.1f} before {b:.1f} ms, {a / b:.3f}; fastest {fa:.1f} {fb:.1f}, {fa / fb:.3f}; "
    f"identical {same}",
    flush=True,
)
skinny._lib = now_lib
