"""models.packing.pack alone (warm, timeit), a 10-node tree step and a one-token step, and the
Python glue's pieces (_gather, _checked_blocks, the ctypes pack_check call, reserve)."""
import sys
import timeit
sys.path.insert(0,'.')
import torch
from models import packing
from models.runner import StepInput
from models.kv_cache import PagedKVCache
from models.loader import load_model
cfg = load_model("smollm2").model.cfg
cache = PagedKVCache(cfg, 200, 16)
cache.add(0)
cache.reserve({0: 300})
cache.lengths[0] = 300
tree_par = [-1,0,1,2,0,4,0,6,7,0]
inp = StepInput(0, list(range(100,110)), [0,1,2,3,1,2,1,2,3,1], None, [0,1,2,3,4,5,6,7,8,9], tree_par)
inp1 = StepInput(0, [5])
st = packing.thread_staging()
L = packing.LIBRARY.get()
for name, i in (("tree10", inp), ("ar", inp1)):
    inputs=[i]
    n=20000
    def f():
        return packing.pack(cache, inputs, cfg.vocab_size, 8192, 'cpu', st)
    f()
    print(name, "pack", min(timeit.repeat(f, number=n, repeat=3))/n*1e6)
    def g():
        return packing._gather(cache, inputs)
    print(name, "gather", min(timeit.repeat(g, number=n, repeat=3))/n*1e6)
    ga = g()
    def h():
        return packing._checked_blocks(cache, inputs, ga, cfg.vocab_size, 8192)
    print(name, "checked_blocks", min(timeit.repeat(h, number=n, repeat=3))/n*1e6)
    def c():
        return L.pack_check(1, *ga[0], cfg.vocab_size, 8192)
    print(name, "pack_check call", min(timeit.repeat(c, number=n, repeat=3))/n*1e6)
    def r():
        return cache.reserve({0: len(i.tokens)})
    print(name, "reserve", min(timeit.repeat(r, number=n, repeat=3))/n*1e6)
    def d():
        return torch.device('cpu').type
    print("torch.device", min(timeit.repeat(d, number=n, repeat=3))/n*1e6)
