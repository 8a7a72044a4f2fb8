"""The Python lines of models/llama.py _whole_stack in the real decoding loop (ar, the default model, 5
prompts of bench/host_step.py's answers file at /tmp/host_step_answers.json, 128 tokens): the function's
source with a clock read before chosen statements, medians of each stretch. From the repository root."""

import collections
import json
import statistics
import sys
import time
import inspect
import textwrap

sys.path.insert(0, ".")
import models.llama as L
from decoding import generate, make_proposer
from decoding.options import planner_for
from models.loader import load_model
from models.machine import DEFAULT_CACHE_DIR

src = textwrap.dedent(inspect.getsource(L.Transformer._whole_stack))
lines = src.split("\n")
out = []
stamp = 0
body_started = False
for ln in lines:
    out.append(ln)
    s = ln.strip()
    if s.startswith('"""') and s.endswith('"""') is False and not body_started and ln.startswith('    """'):
        pass
# insert stamps before selected statements
marks = [
    "b = bucket(",
    "plain, tensors",
    "ptrs = self._layer_ptrs",
    "seqs = plan.seqs",
    "slots = meta.slot_mapping",
    "step = skinny.StepArgs",
    "norm, out = self.norm",
    "kv_token =",
    "skinny.layers_unchecked",
    "return out if",
]
res = []
for ln in lines:
    for i, m in enumerate(marks):
        if ln.strip().startswith(m):
            ind = ln[: len(ln) - len(ln.lstrip())]
            res.append(f"{ind}_T.append(({i}, _pc()))")
    res.append(ln)
src2 = "\n".join(res)
src2 = src2.replace("cfg = self.cfg", "_T.append((-1, _pc())); cfg = self.cfg", 1)
ns = dict(vars(L))
_T = []
ns["_T"] = _T
ns["_pc"] = time.perf_counter
exec(src2, ns)
L.Transformer._whole_stack = ns["_whole_stack"]
model = load_model("smollm2").model
prompts = json.load(open("/tmp/host_step_answers.json"))["prompts"][:5]
planner = planner_for(model, "ar", False, DEFAULT_CACHE_DIR)
for pr in prompts:
    generate(model, [pr], make_proposer("ar"), max_new_tokens=128, planner=planner)
seg = collections.defaultdict(list)
prev = None
for i, t in _T:
    if i == -1:
        prev = (i, t)
        continue
    if prev is not None:
        seg[(prev[0], i)].append((t - prev[1]) * 1e6)
    prev = (i, t)
names = {-1: "start"} | {i: m for i, m in enumerate(marks)}
for (a, b), v in sorted(seg.items()):
    print(f"{names[a][:28]:30s} -> {names[b][:28]:30s} n={len(v):5d} median {statistics.median(v):7.1f} us")
