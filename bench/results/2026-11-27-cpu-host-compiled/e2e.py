"""End to end with the real forward: every method on the compiled host path and on the
reference, alternated in one process, the planner as the benchmark runs it (measured step
cost, the host's time learned). Prints per method and path the decoding time after the first
token (summed over the prompts, fastest of the rounds), tau, and whether every output is ar's.

    python bench/results/2026-11-27-cpu-host-compiled/e2e.py [--limit 1] [--rounds 2] [--weights fp32]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import compiled, generate, make_proposer  # noqa: E402
from decoding.options import planner_for  # noqa: E402
from models.cost import step_cost  # noqa: E402
from models.loader import DEFAULT_CACHE_DIR, load_model  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--limit", type=int, default=1)
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--weights", default=None, help="load_model's weights (where it takes them)")
p.add_argument("--methods", default="ar,pld,lookahead+pld,recycle,suffix,hybrid")
args = p.parse_args()
kw = {"weights": args.weights} if args.weights else {}
lm = load_model("smollm2", **kw)
model, tok = lm.model, lm.tokenizer
records = load_suite(split="test", limit=args.limit)
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in records]
methods = args.methods.split(",")
best, outs, taus = {}, {}, {}
generate(model, prompts[:1], make_proposer("ar"), max_new_tokens=8)  # warm-up
cost = step_cost(model, DEFAULT_CACHE_DIR)  # once, as the benchmark does
for rnd in range(args.rounds):
    for m in methods:
        for path in ("compiled", "reference"):
            compiled.use_compiled(path == "compiled")
            decode_s, tokens, forwards, answers = 0.0, 0, 0, []
            for prompt in prompts:
                first = []
                t0 = time.perf_counter()

                def on_tokens(i, new, first=first):
                    if not first:
                        first.append(time.perf_counter())
                    return False

                out = generate(model, [prompt], make_proposer(m), max_new_tokens=128, on_tokens=on_tokens,
                               planner=planner_for(model, m, False, DEFAULT_CACHE_DIR, cost=cost))[0]
                decode_s += time.perf_counter() - first[0]
                tokens += len(out.output_ids) - 1
                forwards += out.stats.forwards
                answers.append(out.output_ids)
            key = (m, path)
            best[key] = min(best.get(key, float("inf")), decode_s)
            outs[key] = answers
            taus.setdefault(key, []).append(tokens / max(forwards, 1))
compiled.use_compiled(True)
print(f"{len(prompts)} prompts, 128 new tokens, {torch.get_num_threads()} threads, fastest of {args.rounds} rounds; "
      f"weights {args.weights or 'default'}")
print("| method | path | decode s (after the first token) | tok/s | vs ar (same path) | tau per round | = ar |")
print("|---|---|---:|---:|---:|---|---|")
for (m, path), s in best.items():
    n = sum(len(a) - 1 for a in outs[m, path])
    same = outs[m, path] == outs["ar", path] == outs["ar", "compiled"]
    print(f"| {m} | {path} | {s:.2f} | {n / s:.1f} | {best['ar', path] / s:.2f} | "
          f"{', '.join(f'{t:.2f}' for t in taus[m, path])} | {'yes' if same else 'NO'} |")
