"""Decoding with the side stream forced on (SPECDEC_SIDE_PREFETCH=1, the code before 457b090) and
by the cache size (the default: off on this machine) in one process, alternated: the bench's
prompts (test split, LIMIT per task), batch 1, greedy, 128 new tokens, each setting planning with
its own measured step-cost curve (models/cost.py keys a forced setting apart; the setting is read
each step). Per method and
setting, per round: decode tok/s after the first token (the first streamed piece's time), summed
over the prompts; the median over the rounds, and the outputs' identity. Run from the repository
root: python bench/results/2026-11-28-cpu-side-off/e2e_inproc.py [ROUNDS] [LIMIT]."""
import os
import statistics
import sys
import time

from bench.data.suite import load_suite
from decoding import TextGenerator

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 1
gen = TextGenerator.load()
prompts = [[{"role": "user", "content": r["turns"][0] if r["task"] == "chat" else r["prompt"]}]
           for r in load_suite(split="test", limit=limit)]
methods = ["ar", "pld", "suffix", "hybrid"]
settings = {"on": "1", "auto": ""}
res = {(m, s): [] for m in methods for s in settings}
outs = {}
for rnd in range(rounds + 1):  # round 0 warms up (and measures the step-cost curve)
    order = list(settings) if rnd % 2 else list(settings)[::-1]
    for m in methods:
        for s in order:
            os.environ["SPECDEC_SIDE_PREFETCH"] = settings[s]
            if not settings[s]:
                del os.environ["SPECDEC_SIDE_PREFETCH"]
            toks, secs = 0, 0.0
            for i, p in enumerate(prompts):
                first = []
                t0 = time.perf_counter()
                out = gen.generate([p], m, max_new_tokens=128,
                                   stream=lambda _i, _piece: first or first.append(time.perf_counter()))[0]
                t1 = time.perf_counter()
                toks += len(out.token_ids) - 1
                secs += t1 - (first[0] if first else t0)
                outs.setdefault((m, i), out.token_ids)
                assert out.token_ids == outs[("ar", i)], (m, s, i)
            if rnd:
                res[m, s].append(toks / secs)
    print(f"round {rnd} done {time.strftime('%H:%M:%S')}", flush=True)
print(f"{len(prompts)} prompts, {rounds} rounds; decode tok/s after the first token, median (min-max); "
      "every output equal to ar's")
print("| method | side stream on | by the cache (off here) | off / on |\n|---|---:|---:|---:|")
for m in methods:
    on, auto = res[m, "on"], res[m, "auto"]
    print(f"| {m} | {statistics.median(on):.1f} ({min(on):.1f}-{max(on):.1f}) | {statistics.median(auto):.1f} "
          f"({min(auto):.1f}-{max(auto):.1f}) | {statistics.median(a / o for a, o in zip(auto, on)):.3f} |")
