"""The default model's forward (native Q4_1 weights, fp16 KV cache, 2 threads) with two builds of the
CPU library (argv: NAME=PATH.so ...), alternated in one process: per (context, step tokens; a random
draft tree's mask) the median over 5 rounds of each build's fastest of 5 forwards (ms), and whether
the builds' logits are equal bit for bit. Run from the repository root. Optional --contexts=A,B and
--tokens=A,B (default 512,1500 and 1,4,8,16; ../2026-11-28-cpu-side-off ran it at longer contexts)."""
import ctypes
import statistics
import sys
import time

import torch

from bench.model_speed import setup_batch
from kernels import skinny
from models.cost import random_tree
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

skinny._load()
libs = {}
opts = {a.split("=")[0]: [int(v) for v in a.split("=")[1].split(",")] for a in sys.argv[1:] if a.startswith("--")}
contexts, steps = opts.get("--contexts", [512, 1500]), opts.get("--tokens", [1, 4, 8, 16])
for arg in (a for a in sys.argv[1:] if not a.startswith("--")):
    name, path = arg.split("=")
    libs[name] = ctypes.CDLL(path)
    skinny._declare(libs[name])
model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=2 * max(contexts + [1600]) + 64, block_size=16)
gen = torch.Generator().manual_seed(0)
for ctx in contexts:
    seqs = setup_batch(runner, 1, ctx)
    for T in steps:
        depth, mask = random_tree(T, gen)
        toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
        tokens, meta, idx = runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask)
                                            for s in seqs])
        res = {n: [] for n in libs}
        outs = {}
        for _ in range(5):
            for n, lib in libs.items():
                skinny._lib = lib
                best = 1e9
                for _ in range(5):
                    with torch.inference_mode():
                        t0 = time.perf_counter()
                        y = model(tokens, meta, runner.cache.k, runner.cache.v, idx)
                        best = min(best, time.perf_counter() - t0)
                res[n].append(best * 1e3)
                outs[n] = y.clone()
        med = {n: statistics.median(v) for n, v in res.items()}
        base = list(libs)[0]
        same = all(torch.equal(outs[base], o) for o in outs.values())
        print(f"context {ctx:5d} T {T:3d} " + " ".join(f"{n} {med[n]:7.2f} ms ({med[n] / med[base]:.3f})"
                                                   for n in libs) + f" equal {same}", flush=True)
