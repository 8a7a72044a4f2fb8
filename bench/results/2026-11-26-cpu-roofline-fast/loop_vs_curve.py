"""The forward of decoding steps in the loop against the step-cost curve, in one process: the
curve measured (or checked) first, then ar, suffix and hybrid on two test prompts per task with
the planner, every greedy forward timed (to the final norm, then the LM head screen) and
bucketed by step tokens, beside the curve's prediction for its tokens and committed length.

    python bench/results/2026-11-26-cpu-roofline-fast/loop_vs_curve.py
"""

import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.data.suite import load_suite  # noqa: E402
from decoding import generate, make_proposer  # noqa: E402
from decoding.options import planner_for  # noqa: E402
from kernels import skinny  # noqa: E402
from kernels.backend import get_backend  # noqa: E402
from models.cost import step_cost  # noqa: E402
from models.loader import DEFAULT_CACHE_DIR, load_model  # noqa: E402
from models.runner import ModelRunner  # noqa: E402


def main() -> None:
    model, tok = load_model("smollm2", get_backend("torch"), torch.float32, "cpu")
    cost = step_cost(model, DEFAULT_CACHE_DIR)
    print("curve ms", dict(zip(cost.tokens, (round(x, 1) for x in cost.ms))))
    recs, current = collections.defaultdict(list), [""]

    def screened(self, tokens, meta, idx, k=1):  # ModelRunner.forward_screened, timed in two parts
        t0 = time.perf_counter()
        h = self.forward(tokens, meta, idx, hidden=True).contiguous()
        t1 = time.perf_counter()
        ids, _ = skinny.head_topk(h, self.head_screen(k), max(1, k))
        t2 = time.perf_counter()
        recs[current[0]].append((tokens.numel(), int(meta.positions.min()), (t1 - t0) * 1e3, (t2 - t1) * 1e3))
        return h, ids.tolist()

    ModelRunner.forward_screened = screened
    by_task = collections.defaultdict(list)
    for r in load_suite(split="test"):
        by_task[r["task"]].append(r)
    prompts = [tok.apply_chat_template([{"role": "user", "content": r["turns"][0] if r["task"] == "chat"
                                         else r["prompt"]}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for rs in by_task.values() for r in rs[:2]]
    for name in ("ar", "suffix", "hybrid"):
        current[0] = name
        for p in prompts:
            generate(model, [p], None if name == "ar" else make_proposer(name), max_new_tokens=128,
                     planner=planner_for(model, name, False, None, cost, False))
    print("| method | step tokens | steps | forward ms | head ms | sum | curve ms | committed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, rows in recs.items():
        buckets = collections.defaultdict(list)
        for T, ctx, f, h in rows:
            buckets[1 if T == 1 else 4 if T <= 4 else 8 if T <= 8 else 12 if T <= 12 else 64].append(
                (f, h, cost([T], [ctx]), ctx))
        for b, g in sorted(buckets.items()):
            f, h = statistics.median(x[0] for x in g), statistics.median(x[1] for x in g)
            print(f"| {name} | <= {b} | {len(g)} | {f:.2f} | {h:.2f} | {f + h:.2f} | "
                  f"{statistics.median(x[2] for x in g):.2f} | {statistics.median(x[3] for x in g):.0f} |")


if __name__ == "__main__":
    main()
