"""The layer stack's phases (kernels.skinny.stack_profile) of the default model's forward (native Q4_1
weights, fp16 KV cache, 2 threads), 512 committed tokens, steps of 1-16 tokens in a random draft tree:
40 forwards plain, then 40 profiled (their time too); ms a forward. Run from the repository root."""
import time

import torch

from bench.model_speed import setup_batch
from kernels import skinny
from models.cost import random_tree
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=2 * 1600 + 64, block_size=16)
gen = torch.Generator().manual_seed(0)
seqs = setup_batch(runner, 1, 512)
n = 40
for T in (1, 4, 8, 16):
    depth, mask = random_tree(T, gen)
    toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
    tokens, meta, idx = runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask)
                                        for s in seqs])
    for _ in range(5):
        runner.forward_greedy(tokens, meta, idx)
    t0 = time.perf_counter()
    for _ in range(n):
        runner.forward_greedy(tokens, meta, idx)
    plain = (time.perf_counter() - t0) / n * 1e3
    with skinny.stack_profile() as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            runner.forward_greedy(tokens, meta, idx)
        profiled = (time.perf_counter() - t0) / n * 1e3
    phases = " ".join(f"{k} {v / n * 1e3:.2f}" for k, v in prof.items())
    stack = sum(prof.values()) / n * 1e3
    print(f"ctx 512 T {T:2d}: forward {plain:6.2f} ms (profiled {profiled:6.2f}); stack {stack:6.2f}; {phases}",
          flush=True)
