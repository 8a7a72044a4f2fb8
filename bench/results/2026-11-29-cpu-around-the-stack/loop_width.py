"""Loop forwards by T with their contexts and shapes; then the same (T, context) standalone."""

import collections
import json
import statistics
import sys
import time

sys.path.insert(0, ".")
import torch
import models.runner as MR
from decoding import generate, make_proposer
from decoding.options import planner_for
from models.loader import load_model
from models.machine import DEFAULT_CACHE_DIR
from models.runner import StepInput

model = load_model("smollm2").model
prompts = json.load(open("/tmp/host_step_answers.json"))["prompts"][:5]
rec, info = [], []
forward, prepare = MR.ModelRunner._forward_ranked, MR.ModelRunner.prepare


def timed_forward(self, *a, **k):
    t = time.perf_counter()
    out = forward(self, *a, **k)
    rec.append(((time.perf_counter() - t) * 1e3,) + info[-1])
    return out


def noted_prepare(self, inputs, *a, **k):
    i = inputs[0]
    info.append(
        (
            len(i.tokens),
            self.context_len(i.seq_id),
            i.parents is not None,
            (len(i.logits_rows) if i.logits_rows is not None else -1),
        )
    )
    return prepare(self, inputs, *a, **k)


MR.ModelRunner._forward_ranked, MR.ModelRunner.prepare = timed_forward, noted_prepare
for m in sys.argv[1].split(","):
    planner = planner_for(model, m, False, DEFAULT_CACHE_DIR)
    rec.clear()
    info.clear()
    for pr in prompts:
        generate(model, [pr], make_proposer(m), max_new_tokens=128, planner=planner)
    by = collections.defaultdict(list)
    for ms, T, ctx, tree, nl in rec:
        by[(T, tree)].append((ms, ctx, nl))
    print(m)
    for key in sorted(by):
        v = by[key]
        print(
            f"  T={key[0]} tree={key[1]:d} n={len(v):4d} ms {statistics.median(x[0] for x in v):6.2f} "
            f"ctx median {statistics.median(x[1] for x in v):6.0f} logit rows {statistics.median(x[2] for x in v)}"
        )
MR.ModelRunner._forward_ranked, MR.ModelRunner.prepare = forward, prepare
# standalone at contexts 300 and 1200
for ctx in (300, 1200):
    runner = MR.ModelRunner(model, cache_tokens=ctx + 200, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, ctx)
    gen = torch.Generator().manual_seed(0)
    st = {
        T: runner.prepare([StepInput(0, torch.randint(0, 49152, (T,), generator=gen).tolist(), list(range(T)), None)])
        for T in (1, 2, 4)
    }
    res = collections.defaultdict(list)
    for _ in range(40):
        for T in (1, 2, 4):
            t = time.perf_counter()
            with torch.inference_mode():
                runner.forward_greedy(*st[T])
            res[T].append((time.perf_counter() - t) * 1e3)
    print("standalone ctx", ctx, {T: round(statistics.median(v[5:]), 2) for T, v in res.items()})
    runner.free(0)
