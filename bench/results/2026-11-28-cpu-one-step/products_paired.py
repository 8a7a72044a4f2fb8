"""Two builds of the CPU library (argv: A=PATH.so B=PATH.so [WIDTHS, default 1,4,8,16]) timed in
pairs: the default model (native Q4_1 weights, fp16 KV cache, 2 threads), 512 committed tokens,
steps of WIDTHS tokens in a random draft tree; per step width 200 pairs of profiled forwards, the
builds alternated forward by forward in ABBA order (kernels.skinny.stack_profile), so that each
pair's two forwards meet the same state of a drifting machine. Prints per width the median and
quartiles of B / A for the four products' sum and the whole stack, and whether the builds' logits
are equal bit for bit. Run from the repository root."""
import ctypes
import statistics
import sys

import torch

from bench.model_speed import setup_batch
from kernels import skinny
from models.cost import random_tree
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

PRODUCTS = ("qkv", "o", "gate_up", "down")
PAIRS = 200
skinny._load()
(na, pa), (nb, pb) = (arg.split("=") for arg in sys.argv[1:3])
libs = {na: ctypes.CDLL(pa), nb: ctypes.CDLL(pb)}
for lib in libs.values():
    skinny._declare(lib)
model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=2 * 1600 + 64, block_size=16)
gen = torch.Generator().manual_seed(0)
seqs = setup_batch(runner, 1, 512)


def forward(name, tokens, meta, idx):
    skinny._lib = libs[name]
    with torch.inference_mode(), skinny.stack_profile() as prof:
        logits = model(tokens, meta, runner.cache.k, runner.cache.v, idx)
    return sum(prof[k] for k in PRODUCTS), sum(prof.values()), logits


for T in [int(t) for t in (sys.argv[3] if len(sys.argv) > 3 else "1,4,8,16").split(",")]:
    depth, mask = random_tree(T, gen)
    toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
    tokens, meta, idx = runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask)
                                        for s in seqs])
    for name in libs:  # warm
        for _ in range(3):
            forward(name, tokens, meta, idx)
    prod, stack, same = [], [], True
    for i in range(PAIRS):
        order = (na, nb) if i % 2 == 0 else (nb, na)
        got = {n: forward(n, tokens, meta, idx) for n in order}
        prod.append(got[nb][0] / got[na][0])
        stack.append(got[nb][1] / got[na][1])
        same = same and torch.equal(got[na][2], got[nb][2])

    def q(v):
        qs = statistics.quantiles(v, n=4)
        return f"{qs[1]:.3f} [{qs[0]:.3f}, {qs[2]:.3f}]"
    print(f"T {T:2d}  {nb} / {na}: products {q(prod)}  stack {q(stack)}  logits equal: {same}", flush=True)
