"""Where a forward's time goes outside its layers' C call, per call, in a decoding-like loop (the
default GGUF, native weights, 2 threads; one sequence over a 512-token prefix; steps of T = 1, 4
and 8 tokens, each step's pieces cold as in the loop: a 128 MB buffer is written between steps so
that the step's code and objects leave the caches, as a forward streaming 100 MB of weights
leaves them). Median of each piece over 40 steps.

    python forward_pieces.py            # this code
    PYTHONPATH=/work/wt-s5 python forward_pieces.py   # (run from that worktree) another code
"""
import functools
import sys
import time

import torch

sys.path.insert(0, ".")  # the code of the working directory
from kernels import quant, skinny  # noqa: E402
from models import llama, runner as runner_mod  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402

acc = {}


def wrap(obj, name, label):
    f = getattr(obj, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc.setdefault(label, []).append(time.perf_counter() - t)
    setattr(obj, name, w)


model = load_model("smollm2").model
for obj, name, label in ((runner_mod.ModelRunner, "step_greedy", "step_greedy (prepare + forward + head)"),
                         (runner_mod.ModelRunner, "prepare", "prepare"),
                         (llama.Transformer, "forward", "model forward (to the final norm)"),
                         (skinny, "layers_unchecked", "layers' C call"),
                         (model.backend, "plan", "attention plan"),
                         (llama, "rope_tables", "rope_tables"),
                         (llama.Transformer, "_rope_table", "rope table"),
                         (quant, "quant_linear", "head (quant_linear)"),
                         (quant, "quant_linear_topk", "head with its top-k"),
                         (runner_mod, "argmax_rows", "argmax of the logits"),
                         (runner_mod, "argmax_topk_rows", "top-k of the logits")):
    wrap(obj, name, label)
junk = torch.randn(32 * 1024 * 1024)
runner = ModelRunner(model, cache_tokens=4096)
runner.add_sequence(0)
prompt = list(range(100, 612))
runner.step([StepInput(0, prompt)])
runner.commit({0: list(range(len(prompt)))})
for T in (1, 4, 8):
    acc.clear()
    for rep in range(40):
        junk.add_(1.0)
        runner.step_greedy([StepInput(0, [5] * T, parents=list(range(-1, T - 1)))], k=1)
    for label, ts in acc.items():
        if label == "rope_tables" and len(ts) < 40:
            continue  # the table's making, not a step's
        print(f"T={T} {label:40s} {sorted(ts)[len(ts) // 2] * 1e3:7.3f} ms")
