"""The Qwen2.5-Coder pair on both weight forms in one process, in interleaved rounds (the order
of the forms alternates round by round), so that the machine's drift between runs does not move
the ratios:

* the one-token forward of each model (1.5B target, 0.5B draft) at 256 tokens of context
  (``models.cost.probe_step_cost``: the fastest of its rounds, as the planner's cache check);
* the target's plain greedy decoding (``ar``) of the benchmark's three first turns (code,
  code_edit, chat; test split, one per task, 96 new tokens): tokens/s of the whole turn, ms per
  token after the first, and where the two forms' outputs first differ.

    flock /tmp/timing.lock python bench/results/2026-11-27-cpu-qwen-native/pair_speed.py [--rounds 3]
"""

import argparse
import json
import statistics
import sys
import time

sys.path.insert(0, ".")

from bench.run import load_records, parse_args  # noqa: E402
from decoding import generate  # noqa: E402
from models.cost import probe_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--max-new-tokens", type=int, default=96)
args = ap.parse_args()
FORMS = ("native", "fp32")
MODELS = {"target": "qwen2.5-coder-1.5b", "draft": "qwen2.5-coder-0.5b"}

loaded, loads = {}, {}
for role, name in MODELS.items():
    for w in FORMS:
        t = time.perf_counter()
        loaded[(role, w)] = load_model(name, weights=w)
        loads[f"{role} {w}"] = round(time.perf_counter() - t, 1)
        assert loaded[(role, w)].model.weights == w
        print(f"loaded {name} {w} in {loads[f'{role} {w}']} s", flush=True)

records = load_records(parse_args(["--tasks", "code,code_edit,chat", "--limit", "1"]))
tok = loaded[("target", "native")].tokenizer
prompts = [(r["task"], tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=False)) for r in records]

forward = {k: [] for k in loaded}  # (role, form) -> one-token forward ms per round
ar = {w: [] for w in FORMS}  # form -> per round: (new tokens, whole s, s after the first token) summed
outputs = {}


def decode(model, prompt):
    first = []
    t = time.perf_counter()
    out = generate(model, [prompt], max_new_tokens=args.max_new_tokens,
                   on_tokens=lambda i, new: first.append(time.perf_counter()) and False)[0]
    end = time.perf_counter()
    return out.output_ids, end - t, end - first[0]


for r in range(args.rounds):
    for w in (FORMS if r % 2 == 0 else FORMS[::-1]):
        for role in MODELS:
            forward[(role, w)].append(probe_step_cost(loaded[(role, w)].model, 256, (1,))[1])
        n = whole = after = 0
        for task, p in prompts:
            ids, s, s_after = decode(loaded[("target", w)].model, p)
            outputs[(task, w)] = ids
            n, whole, after = n + len(ids), whole + s, after + s_after
        ar[w].append((n, whole, after, n - len(prompts)))
        print(f"round {r} {w}: forward ms target {forward[('target', w)][-1]:.1f} draft "
              f"{forward[('draft', w)][-1]:.1f}; ar {n / whole:.2f} tok/s whole, "
              f"{1e3 * after / (n - len(prompts)):.1f} ms/token after the first", flush=True)

med = statistics.median
res = {"loads_s": loads, "rounds": args.rounds,
       "forward_ms": {f"{role} {w}": [round(x, 2) for x in v] for (role, w), v in forward.items()},
       "ar": {w: [{"tokens": n, "tok_s": round(n / s, 2), "ms_per_token_after_first": round(1e3 * a / m, 2)}
                  for n, s, a, m in v] for w, v in ar.items()}}
ratio_whole = [(ar["native"][i][0] / ar["native"][i][1]) / (ar["fp32"][i][0] / ar["fp32"][i][1])
               for i in range(args.rounds)]
ratio_after = [(ar["fp32"][i][2] / ar["fp32"][i][3]) / (ar["native"][i][2] / ar["native"][i][3])
               for i in range(args.rounds)]
agree = {}
for task, _ in prompts:
    a, b = outputs[(task, "native")], outputs[(task, "fp32")]
    agree[task] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else
                       min(len(a), len(b)))
res["native_over_fp32"] = {"ar_whole_turn": [round(x, 2) for x in ratio_whole],
                           "ar_after_first_token": [round(x, 2) for x in ratio_after]}
res["first_difference_native_vs_fp32"] = agree
print(json.dumps(res, indent=1))
print("\n| | one-token forward ms, target | draft | draft / target | ar tok/s (whole turn) "
      "| ar ms/token after the first |")
print("|---|---:|---:|---:|---:|---:|")
for w in FORMS:
    t, d = med(forward[("target", w)]), med(forward[("draft", w)])
    print(f"| {w} | {t:.1f} | {d:.1f} | {d / t:.2f} | {med(x[0] / x[1] for x in ar[w]):.2f} | "
          f"{med(1e3 * x[2] / x[3] for x in ar[w]):.1f} |")
print(f"\nnative over fp32 (median of the rounds' ratios): ar whole turn {med(ratio_whole):.2f}x, after the first "
      f"token {med(ratio_after):.2f}x; one-token forward: target "
      f"{med(forward[('target', 'fp32')]) / med(forward[('target', 'native')]):.2f}x, draft "
      f"{med(forward[('draft', 'fp32')]) / med(forward[('draft', 'native')]):.2f}x")
print(f"first difference of the native and fp32 ar outputs, by task (None: identical): {agree}")
