"""In one process, one forward each in turn: this code, against the code before emulated: chain steps'
causal flag turned back into its (T, L) mask in plan_step, and the embedding looked up by torch before
the stack's call (which then gathers the rows again in C, a few microseconds). Contexts 300 and 1,500,
chains of 2, 4, 8 tokens (prepare + greedy forward, ms). From the repository root."""

import statistics
import sys
import time

sys.path.insert(0, ".")
import torch
import kernels.torch_plan as TP
from models.loader import load_model
from models.runner import ModelRunner, StepInput

model = load_model("smollm2").model
real = TP.plan_step
mode = {"bytes": False}


def planned(*a, **k):
    plan = real(*a, **k)
    if mode["bytes"]:
        for sp in plan.seqs:
            if sp.tail_causal:
                m = sp.mask
                sp.tail_causal = False
                sp._mask = m
    return plan


TP.plan_step = planned
import models.llama as L  # noqa: E402

stack = L.Transformer._whole_stack


def with_embedding(self, tokens, *a, **k):
    if mode["bytes"]:
        self.embed(tokens)
    return stack(self, tokens, *a, **k)


L.Transformer._whole_stack = with_embedding
for ctx in (300, 1500):
    runner = ModelRunner(model, cache_tokens=ctx + 200, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, ctx)
    gen = torch.Generator().manual_seed(0)
    for T in (2, 4, 8):
        toks = torch.randint(0, 49152, (T,), generator=gen).tolist()
        res = {False: [], True: []}
        outs = {}
        for i in range(200):
            mode["bytes"] = bool(i % 2)
            t = time.perf_counter()
            with torch.inference_mode():
                st = runner.prepare([StepInput(0, toks, list(range(T)), None)])
                o = runner._forward_ranked(*st)
            res[mode["bytes"]].append((time.perf_counter() - t) * 1e3)
            outs[mode["bytes"]] = o[0]
        same = torch.equal(outs[False], outs[True])
        a, b = statistics.median(res[False][10:]), statistics.median(res[True][10:])
        print(
            f"ctx {ctx} T {T}: now {a:.3f} ms, before {b:.3f} ms, now/before {a / b:.3f}, identical {same}", flush=True
        )
    runner.free(0)
