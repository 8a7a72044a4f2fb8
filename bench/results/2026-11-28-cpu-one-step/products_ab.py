"""The layer stack's product phases (kernels.skinny.stack_profile) with two builds of the CPU library
(argv: NAME=PATH.so ...), alternated in one process: the default model (native Q4_1 weights, fp16
KV cache, 2 threads), 512 committed tokens, steps of 1-16 tokens in a random draft tree; per build
the median over 7 rounds of 10 profiled forwards (after 3 unprofiled) of the four products (qkv, o,
gate_up, down), their sum and the whole stack, ms a forward; then whether the builds' logits of
the last forward are equal bit for bit. Run from the repository root."""
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
for T in (1, 4, 8, 12, 16):
    depth, mask = random_tree(T, gen)
    toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
    tokens, meta, idx = runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask)
                                        for s in seqs])
    res = {n: {k: [] for k in PRODUCTS + ("products", "stack")} for n in libs}
    logits = {}
    for _ in range(7):
        for n, lib in libs.items():
            skinny._lib = lib
            with torch.inference_mode():
                for _ in range(3):
                    logits[n] = model(tokens, meta, runner.cache.k, runner.cache.v, idx)
                with skinny.stack_profile() as prof:
                    for _ in range(10):
                        model(tokens, meta, runner.cache.k, runner.cache.v, idx)
            for k in PRODUCTS:
                res[n][k].append(prof[k] / 10 * 1e3)
            res[n]["products"].append(sum(prof[k] for k in PRODUCTS) / 10 * 1e3)
            res[n]["stack"].append(sum(prof.values()) / 10 * 1e3)
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
    first = next(iter(logits.values()))
    same = all(torch.equal(first, v) for v in logits.values())
    print(f"T {T:2d} " + "  ".join(f"{n}: " + " ".join(f"{k} {m[k]:.3f}" for k in PRODUCTS)
                                   + f" products {m['products']:.2f} stack {m['stack']:.2f} ms"
                                   for n, m in med.items()) + f"  logits equal: {same}", flush=True)
