"""Every method with the real forward on both host paths, alternated in one process (the host's
drift reaches both alike): the default model, 5 prompts (one per task), 128 new tokens, the
planner as the benchmark runs it (measured step cost, the host's time learned). Per method and
path: tokens per second over the 5 prompts (the fastest of the rounds), the speedup over ar on
the same path, mean tau, the step clock's host ms per step, and whether every output equals ar's.

    flock /tmp/timing.lock python bench/results/2026-11-27-cpu-host-drafting/real_forward.py \
        [--weights fp32|native] [--rounds 2]
"""

import argparse
import sys
import time

sys.path.insert(0, ".")

from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import compiled, generate, make_proposer  # noqa: E402
from decoding.options import planner_for  # noqa: E402
from decoding.stats import StepClock  # noqa: E402
from models.cost import step_cost  # noqa: E402
from models.loader import DEFAULT_CACHE_DIR, load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--weights", default="fp32")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--methods", default="ar,pld,lookahead,lookahead+pld,recycle,suffix,hybrid")
args = ap.parse_args()
lm = load_model("smollm2", weights=args.weights)
model, tok = lm.model, lm.tokenizer
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in load_suite(split="test", limit=1)]
cost = step_cost(model, DEFAULT_CACHE_DIR)
methods = args.methods.split(",")
best, outputs = {}, {}
for rnd in range(args.rounds):
    for m in methods:
        for path in ("compiled", "reference"):
            compiled.use_compiled(path == "compiled")
            clock, t0, forwards, new, outs = StepClock(), time.perf_counter(), 0, 0, []
            for p in prompts:
                plan = None if m == "ar" else planner_for(model, m, False, DEFAULT_CACHE_DIR, cost=cost)
                out = generate(model, [p], make_proposer(m), max_new_tokens=128, planner=plan, step_clock=clock)[0]
                forwards += out.stats.forwards
                new += len(out.output_ids)
                outs.append(out.output_ids)
            wall = time.perf_counter() - t0
            per = clock.per_step()
            host = per["host"]
            r = dict(tok_s=new / wall, tau=(new - len(prompts)) / forwards, host=host, fwd=per["forward"])
            outputs[m, path] = outs
            if (m, path) not in best or r["tok_s"] > best[m, path]["tok_s"]:
                best[m, path] = r
            print(f"round {rnd} {m} {path}: {r['tok_s']:.1f} tok/s, tau {r['tau']:.2f}, host {host:.3f} ms/step, "
                  f"forward {per['forward']:.2f} ms", flush=True)
compiled.use_compiled(True)
print(f"\n{args.weights} weights, {len(prompts)} prompts, the fastest of {args.rounds} alternated rounds")
print("| method | compiled tok/s | reference tok/s | compiled / reference | x ar (compiled) | x ar (reference) "
      "| host ms/step: compiled | reference | tau | = ar |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for m in methods:
    c, r = best[m, "compiled"], best[m, "reference"]
    same = all(outputs[m, p] == outputs["ar", "compiled"] for p in ("compiled", "reference"))
    print(f"| {m} | {c['tok_s']:.1f} | {r['tok_s']:.1f} | {c['tok_s'] / r['tok_s']:.3f} "
          f"| {c['tok_s'] / best['ar', 'compiled']['tok_s']:.2f} | {r['tok_s'] / best['ar', 'reference']['tok_s']:.2f} "
          f"| {c['host']:.3f} | {r['host']:.3f} | {c['tau']:.2f} | {'yes' if same else 'NO'} |")
