"""Every method's outputs and statistics (planned and whole trees) on bench/host_step.py's oracle
(pinned plans, no forward), the code of the repository ROOT, written to OUT as JSON: run it on two
commits and compare the files to see that a change to the host path kept every plan and step.

    python bench/results/2026-11-28-cpu-cold-host/same_outputs.py ROOT OUT [ANSWERS]

ANSWERS: host_step's cached answers (default /tmp/host_step_answers.json).
"""
import json
import os
import sys

root = sys.argv[1]
sys.path.insert(0, root)
os.chdir(root)
from bench import host_step as hs  # noqa: E402
from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import generate, make_proposer  # noqa: E402
from decoding.planner import Planner, PlannerConfig  # noqa: E402
from models.cost import load_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

METHODS = ["ar", "pld", "suffix", "lookahead", "lookahead+pld", "recycle", "jacobi", "hybrid"]
loaded = load_model("smollm2")
tok = loaded.tokenizer
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in load_suite(split="test", limit=1)]
saved = json.load(open(sys.argv[3] if len(sys.argv) > 3 else "/tmp/host_step_answers.json"))
assert saved["prompts"] == prompts, "the answers are of other prompts"
cost = load_step_cost(str(hs.DEFAULT_COST))
out = {}
for name in METHODS:
    for plan in (True, False):
        for p, ref in zip(prompts, saved["answers"]):
            runner = hs.OracleRunner(loaded.model, {0: ref}, None, cache_tokens=16 * (-(-(len(p) + 128 + 256) // 16)))
            planner = Planner(cost, PlannerConfig(learn_overhead=False)) if plan else None
            r = generate(loaded.model, [p], make_proposer(name), max_new_tokens=128, planner=planner, runner=runner)[0]
            out.setdefault(f"{name} {'planned' if plan else 'whole trees'}", []).append([r.output_ids,
                                                                                           r.stats.as_dict()])
json.dump(out, open(sys.argv[2], "w"))
print(len(out), "runs written to", sys.argv[2])
