"""How far the default quantized path (native) agrees with fp32: plain greedy (ar) on both weight
forms over the suite's test prompts (first user turns), 128 new tokens; the share of identical
outputs and, for the others, where the first difference falls.

    flock /tmp/timing.lock python bench/results/2026-11-27-cpu-native-default/agreement.py [--limit 4]
"""

import argparse
import json
import sys

sys.path.insert(0, ".")

from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import generate  # noqa: E402
from models.loader import load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--limit", type=int, default=4)
args = ap.parse_args()
records = load_suite(split="test", limit=args.limit)
outs = {}
for weights in ("fp32", "native"):
    lm = load_model("smollm2", weights=weights)
    prompts = [lm.tokenizer.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)
               for r in records]
    outs[weights] = [generate(lm.model, [p], max_new_tokens=128)[0].output_ids for p in prompts]
rows, firsts = [], []
for r, a, b in zip(records, outs["fp32"], outs["native"]):
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    rows.append(dict(task=r["task"], id=r.get("id"), fp32_tokens=len(a), native_tokens=len(b), first_difference=first))
    if first is not None:
        firsts.append(first)
same = sum(r["first_difference"] is None for r in rows)
print(json.dumps(rows, indent=1))
mean = sum(firsts) / max(len(firsts), 1)
print(f"{same} of {len(rows)} outputs identical; the others first differ at token {mean:.1f} on average "
      f"(min {min(firsts, default=0)}, max {max(firsts, default=0)})")
