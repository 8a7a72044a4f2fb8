"""Where a forward's time goes at 1 and 8 tokens (512 keys, native weights, the side stream as the
cache says): the stack's phases (kernels.skinny.stack_profile), the mean of 100 forwards; then the
pieces (forward_greedy, the forward to the final norm, the quantized head with its ranking alone,
the stack alone), medians of 60. Run from the repository root."""
import statistics
import time

import torch

from bench.model_speed import setup_batch
from kernels import quant, skinny
from models.cost import random_tree
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=2 * 1600 + 64, block_size=16)
gen = torch.Generator().manual_seed(0)
seqs = setup_batch(runner, 1, 512)
lib = skinny._require()


def step(T):
    depth, mask = random_tree(T, gen)
    toks = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).tolist()
    return runner.prepare([StepInput(s, toks, depths=depth, mask=None if T == 1 else mask) for s in seqs])


def ms(f):
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1e3


with torch.inference_mode():
    for T in (1, 8, 1, 8):
        prep, n = step(T), 100
        for _ in range(10):
            runner.forward_greedy(*prep)
        with skinny.stack_profile() as prof:
            wall = ms(lambda: [runner.forward_greedy(*prep) for _ in range(n)]) / n
        print(f"T {T}: forward_greedy {wall:.2f} ms, stack phases {sum(prof.values()) / n * 1e3:.2f} ms: "
              + ", ".join(f"{k} {v / n * 1e3:.2f}" for k, v in prof.items()), flush=True)
    for T in (1, 8, 1, 8):
        prep = step(T)
        h = runner.forward(*prep, hidden=True).contiguous()
        res = {"greedy": [], "hidden": [], "head": [], "stack": []}
        for _ in range(60):
            res["greedy"].append(ms(lambda: runner.forward_greedy(*prep)))
            res["hidden"].append(ms(lambda: runner.forward(*prep, hidden=True)))
            res["head"].append(ms(lambda: quant.topk_unchecked(lib, h, model.head_quant, 1, skinny._threads(None))))
            with skinny.stack_profile() as prof:
                runner.forward(*prep, hidden=True)
            res["stack"].append(sum(prof.values()) * 1e3)
        print(f"T {T}: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in res.items()) + " ms (medians)",
              flush=True)
