"""In one process, one forward each in turn: the skinny library built from this checkout against the
same library built with some of its files as a commit had them (``FILES``, comma-separated names in
kernels/cpu/), swapped as the module's library between forwards. Steps of B sequences of T tokens
each (chains after a committed context of C tokens per sequence), prepared and forwarded greedily:
ms, medians and fastest after 5 warm-up forwards; every output compared bit for bit. From the
repository root: python bench/results/2026-11-29-cpu-six-row-tiles/ab_batch.py COMMIT FILES [rounds]"""

import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, ".")
import torch  # noqa: E402
from kernels import cbuild, skinny  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402

commit, files = sys.argv[1], sys.argv[2].split(",")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 100
model = load_model("smollm2").model
now_lib = skinny._require()
isa = skinny._isa
tmp = Path(tempfile.mkdtemp())
for src in skinny.SOURCES + skinny.HEADERS:  # the sources, the named files as the commit had them
    text = (
        subprocess.run(
            ["git", "show", f"{commit}:kernels/cpu/{src.name}"], capture_output=True, text=True, check=True
        ).stdout
        if src.name in files
        else src.read_text()
    )
    (tmp / src.name).write_text(text)
path, _ = cbuild.build(
    f"skinny-{isa}-{commit}",
    [tmp / s.name for s in skinny.SOURCES],
    [tmp / h.name for h in skinny.HEADERS],
    skinny.FLAGS + skinny.ISAS[isa][0] + skinny._extra_flags(isa) + [f"-I{tmp}"],
    skinny.LIBS,
)


class Lib(ctypes.CDLL):
    """A library of the commit's sources: a function it does not have yet (one this checkout added) is
    declared on a stand-in, so that the library's declarations of the rest apply."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return types.SimpleNamespace()


before_lib = Lib(str(path))
skinny._declare(before_lib)
libs = {"now": now_lib, "before": before_lib}
gen = torch.Generator().manual_seed(0)
for B, C in ((1, 300), (2, 300), (4, 300), (8, 300), (8, 1000)):
    runner = ModelRunner(model, cache_tokens=B * (C + 64), block_size=16)
    for s in range(B):
        runner.add_sequence(s)
        runner.assume_context(s, C)
    for T in (1, 2, 4):
        steps = [StepInput(s, torch.randint(0, 49152, (T,), generator=gen).tolist(), list(range(T))) for s in range(B)]
        res, outs = {"now": [], "before": []}, {}
        for i in range(rounds):
            name = "now" if i % 2 else "before"
            skinny._lib = libs[name]
            t = time.perf_counter()
            with torch.inference_mode():
                o = runner._forward_ranked(*runner.prepare(steps))
            res[name].append((time.perf_counter() - t) * 1e3)
            outs[name] = o
        same = torch.equal(outs["now"][0], outs["before"][0]) and outs["now"][1:] == outs["before"][1:]
        a, b = statistics.median(res["now"][5:]), statistics.median(res["before"][5:])
        fa, fb = min(res["now"]), min(res["before"])
        print(
            f"batch {B} context {C} T {T}: median now {a:7.3f} before {b:7.3f} ms, {a / b:.3f}; fastest "
            f"{fa:7.3f} {fb:7.3f}, {fa / fb:.3f}; identical {same}",
            flush=True,
        )
    for s in range(B):
        runner.free(s)
skinny._lib = now_lib
