"""The torch backend's attention plan (kernels/torch_plan.py ``plan_step``) of one step alone,
hot (called back to back) and cold (a 128 MB buffer written before each call): batch 1 and 8, a
one-token step and a tree (each sequence over a 512-token prefix). Median of 40 calls.

    python plan_alone.py
"""
import sys
import time

import torch

sys.path.insert(0, ".")  # the code of the working directory
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402

model = load_model("smollm2").model
junk = torch.randn(32 * 1024 * 1024)
runner = ModelRunner(model, cache_tokens=8192)
for b in range(8):
    runner.add_sequence(b)
    p = list(range(100 + b, 612 + b))
    runner.step([StepInput(b, p)])
    runner.commit({b: list(range(len(p)))})
for B, T in ((1, 1), (1, 8), (8, 1), (8, 5)):
    inputs = [StepInput(b, [5] * T, parents=None if T == 1 else [-1] + [max(0, i - 2) for i in range(1, T)])
              for b in range(B)]
    tokens, meta, idx = runner.prepare(inputs)
    for cold in (False, True):
        ts = []
        for r in range(40):
            if cold:
                junk.add_(1.0)
            t = time.perf_counter()
            model.backend.plan(meta, runner.cache.block_size, None)
            ts.append(time.perf_counter() - t)
        print(f"batch {B}, {T} token(s) a sequence, {'cold' if cold else 'hot '}: {sorted(ts)[20] * 1e6:7.1f} us")
