"""How much of a cold step's host time is the interpreter's own code: bench/host_step.py
--cold 100, and the same with libpython's machine code (its r-x mapping) read again after
each step's 100 MB, so that the code is in the caches and the Python objects are not.
Alternated ROUNDS times (argument 1, default 3); run from the repository root.

    python bench/results/2026-11-28-cpu-cold-host/warm_text.py 3
"""
import contextlib
import ctypes
import io
import sys

import numpy as np

sys.path.insert(0, ".")
from bench import host_step as hs  # noqa: E402

TEXT = []
for line in open("/proc/self/maps"):
    if "r-xp" in line and "libpython" in line:
        a, b = (int(x, 16) for x in line.split()[0].split("-"))
        TEXT.append(np.ctypeslib.as_array((ctypes.c_uint64 * ((b - a) // 8)).from_address(a)))
if not TEXT:
    sys.exit("this Python has no libpython mapping (a static build): nothing to warm")


class Flush:
    """The oracle's 100 MB read, then libpython's code."""

    def __init__(self, flush):
        self.flush = flush

    def sum(self):
        self.flush.sum()
        for t in TEXT:
            t.sum()


_init = hs.OracleRunner.__init__
warm = [False]


def init(self, model, answers, flush=None, **kw):
    _init(self, model, answers, Flush(flush) if warm[0] and flush is not None else flush, **kw)


hs.OracleRunner.__init__ = init
args = ["--methods", "ar,pld,suffix,lookahead+pld,hybrid", "--cold", "100", "--repeats", "1"]
if len(sys.argv) > 2:
    args += ["--answers", sys.argv[2]]
print(f"libpython's code: {sum(t.nbytes for t in TEXT) // 1024} KB")
rows = {}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for side in ("cold", "code warm"):
        warm[0] = side != "cold"
        with contextlib.redirect_stdout(io.StringIO()):
            out = hs.main(args)
        for name, d in out["methods"].items():  # "method path"
            rows.setdefault(name.split()[0], {}).setdefault(side, []).append(d["host"])
print("| method | host ms a step, cold | libpython's code warm | saved |\n|---|---|---|---|")
for name, d in rows.items():
    c, w = min(d["cold"]), min(d["code warm"])
    print(f"| {name} | {' / '.join(f'{x:.3f}' for x in d['cold'])} | {' / '.join(f'{x:.3f}' for x in d['code warm'])} "
          f"| {1 - w / c:.0%} (fastest of each) |")
