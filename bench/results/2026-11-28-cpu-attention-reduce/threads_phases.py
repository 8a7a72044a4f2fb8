"""The default model's 8-token forward (a random draft tree over CONTEXT keys) with 2 threads and with
1, alternated over 3 rounds: each round's fastest of 7, with the layer stack's phases (ms). Run from the
repository root: python threads_phases.py CONTEXT T."""
import sys
import time

import torch

from bench.model_speed import setup_batch
from kernels import skinny
from models.cost import random_tree
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=1600 + 64, block_size=16)
gen = torch.Generator().manual_seed(0)
ctx, T = int(sys.argv[1]), int(sys.argv[2])
seqs = setup_batch(runner, 1, ctx)
depth, mask = random_tree(T, gen)
toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
tokens, meta, idx = runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask) for s in seqs])
for _ in range(3):
    for th in (2, 1):
        torch.set_num_threads(th)
        best = None
        for _ in range(7):
            with torch.inference_mode(), skinny.stack_profile() as ph:
                t = time.perf_counter()
                model(tokens, meta, runner.cache.k, runner.cache.v, idx)
                wall = time.perf_counter() - t
            if best is None or wall < best[0]:
                best = (wall, dict(ph))
        wall, ph = best
        out = {k: 1e3 * v for k, v in ph.items()}
        out["outside"] = 1e3 * wall - sum(out.values())
        print(f"threads {th} wall {wall * 1e3:6.2f} ms | " + " ".join(f"{k} {v:.2f}" for k, v in out.items()),
              flush=True)
