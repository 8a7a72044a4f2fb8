"""An 8-token chain step (one sequence over a 512-token prefix, the default GGUF, native weights,
2 threads), each step cold (a 128 MB buffer written before it): the median step_greedy and the
one-call stack's phases (kernels.skinny.stack_profile, mean ms a step) over 20 steps. Run from the
root of the code to time (the session's start code: its worktree).

    python stack_phases.py
"""
import sys
import time

import torch

sys.path.insert(0, '.')
from kernels import skinny
from models.loader import load_model
from models.runner import ModelRunner, StepInput
model = load_model("smollm2").model
junk = torch.randn(32 * 1024 * 1024)
runner = ModelRunner(model, cache_tokens=4096)
runner.add_sequence(0)
prompt = list(range(100, 612))
runner.step([StepInput(0, prompt)])
runner.commit({0: list(range(len(prompt)))})
T = 8
with skinny.stack_profile() as prof:
    ts = []
    for rep in range(20):
        junk.add_(1.0)
        t = time.perf_counter()
        runner.step_greedy([StepInput(0, [5] * T, parents=list(range(-1, T - 1)))], k=1)
        ts.append(time.perf_counter() - t)
print("step %.2f ms" % (sorted(ts)[10] * 1e3), {k: round(v / 20 * 1e3, 3) for k, v in prof.items()})
