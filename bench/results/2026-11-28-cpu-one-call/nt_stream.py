"""The planner's step cycle (max_depth, a chain tree built in C, select, observe_all,
observe_time) right after one thread read 100 MB four ways (nt_stream.c): plain loads, with a
prefetchnta ahead, each line flushed after it (clflushopt), non-temporal loads (vmovntdqa).
Median of 200. Run from the root of the code:

    gcc -O2 -mavx2 -mclflushopt -shared -fPIC nt_stream.c -o /tmp/nt_stream.so
    python nt_stream.py /tmp/nt_stream.so
"""
import sys
import time
import ctypes
import random
sys.path.insert(0, ".")
import torch
from bench.host_step import DEFAULT_COST
from decoding import compiled_draft
from decoding.planner import Planner, PlannerConfig
from decoding.proposer import Outcome
from decoding.tree import PLD
from models.cost import load_step_cost
lib = ctypes.CDLL(sys.argv[1])
lib.stream.restype = ctypes.c_float
lib.stream.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
junk = torch.ones(100 * (1 << 18))
n = junk.numel()
cost = load_step_cost(DEFAULT_COST)
compiled_draft.LIBRARY.get()
buf = compiled_draft.TreeBuf()
for mode in (0, 1, 2, 3, 0):
    plan = Planner(cost, PlannerConfig())
    rng = random.Random(0)
    cold, st = [], []
    for step in range(200):
        t = time.perf_counter()
        lib.stream(junk.data_ptr(), n, mode)
        st.append(time.perf_counter() - t)
        t0 = time.perf_counter()
        plan.max_depth([0], PLD, [600 + step])
        buf.start(5, 16)
        buf.add_chain([rng.randrange(3) for _ in range(8)], PLD, 16)
        tree = buf.step_tree()
        keep = plan.select([0], [tree])
        k = keep[0]
        out = Outcome(tree=tree, path=[0], new_tokens=[1], logits=None, rows={n_: j for j, n_ in enumerate(k)},
                      sent=len(k))
        plan.observe_all([0], [out])
        plan.observe_time([len(k)], 4.5, 1)
        cold.append(time.perf_counter() - t0)
    print(f"mode {mode}: stream {sorted(st)[100]*1e3:.2f} ms (1 thread, 100 MB), "
          f"host cycle after it {sorted(cold)[100]*1e6:.1f} us")
