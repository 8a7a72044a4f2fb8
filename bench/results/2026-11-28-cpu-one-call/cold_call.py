"""What one call costs cold (128 MB written before it) and hot: an empty Python function, a
method, the C glue's append_tail, a ctypes call, CHistory.extend_from. Medians of 200.

    python cold_call.py
"""
import sys
import time
import torch
sys.path.insert(0, ".")
from decoding import compiled, compiled_draft
junk = torch.empty(32 * 1024 * 1024)
glue = compiled.glue()
h = compiled_draft.CHistory([1, 2, 3])
addr = compiled_draft._address("hist_append")
lib = compiled_draft.LIBRARY.lib
def f(): pass
class Obj:
    def m(self, x): return x
o = Obj()
cases = {
  "empty py call": lambda: f(),
  "method call": lambda: o.m(1),
  "glue append_tail": lambda: glue.append_tail(addr, h._h, [], 0),
  "ctypes hist_len": lambda: lib.hist_len(h._h),
  "CHistory.extend_from []": lambda: h.extend_from([], 0),
}
for name, fn in cases.items():
    cold, hot = [], []
    for r in range(200):
        junk.add_(1.0)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        cold.append(t1 - t0)
        hot.append(t2 - t1)
    cold.sort()
    hot.sort()
    print(f"{name:28s} cold {cold[100]*1e6:6.2f} us  hot {hot[100]*1e6:6.2f} us")
