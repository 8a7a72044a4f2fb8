"""The forward's time by step width in the decoding loop against the same widths timed alone: ar, pld
and hybrid over 6 chat / code-edit prompts of the suite (128 tokens, planned with the pinned curve),
two rounds, every greedy forward timed around ModelRunner._forward_ranked; then probe_step_cost (the
curve's own probe: random trees, the fastest of 5 rounds) at 256 and 512 committed tokens. Median and
minimum ms in the loop per width (widths met at least 5 times). Run from the repository root."""
import collections
import statistics
import time
from pathlib import Path

from bench.data.suite import load_suite, user_turns
from decoding import Planner, generate, make_proposer
from models.cost import load_step_cost, probe_step_cost
from models.loader import default_model_path, load_model
from models.runner import ModelRunner

model, tok = load_model(default_model_path(), weights="native")
recs = [r for r in load_suite() if r["task"] in ("code_edit", "chat")][:6]
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in recs]
cost = load_step_cost(Path(__file__).parent / "pinned_step_cost.json")
times = collections.defaultdict(list)
forward = ModelRunner._forward_ranked
where = ["iso"]


def timed(self, tokens, meta, idx, k=1):
    t = time.perf_counter()
    out = forward(self, tokens, meta, idx, k=k)
    times[where[0], len(tokens)].append((time.perf_counter() - t) * 1e3)
    return out


ModelRunner._forward_ranked = timed
for _ in range(2):
    for m in ("ar", "pld", "hybrid"):
        where[0] = m
        for p in prompts:
            generate(model, [p], make_proposer(m), max_new_tokens=128, planner=Planner(cost))
print("prompt tokens", [len(p) for p in prompts])
where[0] = "iso"
alone = {c: probe_step_cost(model, context=c, tokens=(1, 2, 3, 4, 5, 6, 8, 10), rounds=5) for c in (256, 512)}
for m in ("ar", "pld", "hybrid"):
    for T in sorted(T for (w, T) in times if w == m):
        v = times[m, T]
        if len(v) >= 5:
            a, b = alone[256].get(T, float("nan")), alone[512].get(T, float("nan"))
            print(f"{m:7s} T {T:3d} n {len(v):4d} median {statistics.median(v):6.2f} min {min(v):6.2f}  "
                  f"iso256 {a:6.2f} iso512 {b:6.2f}")
