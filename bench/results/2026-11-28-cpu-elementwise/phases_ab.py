"""The layer stack's phases (kernels.skinny.stack_profile) with two builds of the CPU library
(argv: NAME=PATH.so ...), alternated in one process: the default model (native Q4_1 weights, fp16
KV cache, 2 threads), 512 committed tokens, steps of 1-16 tokens in a random draft tree; per build
the median over 7 rounds of 10 profiled forwards (after 3 unprofiled) of the RMSNorm and SiLU-mul
phases and of the whole stack, ms a forward. Run from the repository root."""
import ctypes
import statistics
import sys

import torch

from bench.model_speed import setup_batch
from kernels import skinny
from models.cost import random_tree
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

skinny._load()
libs = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=")
    libs[name] = ctypes.CDLL(path)
    skinny._declare(libs[name])
model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=2 * 1600 + 64, block_size=16)
gen = torch.Generator().manual_seed(0)
seqs = setup_batch(runner, 1, 512)
for T in (1, 2, 4, 8, 16):
    depth, mask = random_tree(T, gen)
    toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
    tokens, meta, idx = runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask)
                                        for s in seqs])
    res = {n: {"norm": [], "silu": [], "stack": []} for n in libs}
    for _ in range(7):
        for n, lib in libs.items():
            skinny._lib = lib
            with torch.inference_mode():
                for _ in range(3):
                    model(tokens, meta, runner.cache.k, runner.cache.v, idx)
                with skinny.stack_profile() as prof:
                    for _ in range(10):
                        model(tokens, meta, runner.cache.k, runner.cache.v, idx)
            res[n]["norm"].append(prof["norm"] / 10 * 1e3)
            res[n]["silu"].append(prof["silu"] / 10 * 1e3)
            res[n]["stack"].append(sum(prof.values()) / 10 * 1e3)
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
    print(f"T {T:2d} " + "  ".join(f"{n}: norm {m['norm']:.3f} silu {m['silu']:.3f} stack {m['stack']:.2f} ms"
                                   for n, m in med.items()), flush=True)
