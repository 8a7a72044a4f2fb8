"""The real loop's step clock (host phases, ms a step) per method: PROMPTS prompts (default 3) of
the suite's test split, 128 tokens, each method planned with the pinned curve of
../2026-11-28-cpu-host-split (ar: none), the code of the repository ROOT.

    python bench/results/2026-11-28-cpu-cold-host/real_host.py ROOT METHODS [PROMPTS] [TAG]
"""
import os
import sys
from pathlib import Path

COST = Path(__file__).resolve().parent.parent / "2026-11-28-cpu-host-split" / "pinned_step_cost.json"
root = sys.argv[1]
sys.path.insert(0, root)
os.chdir(root)
from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import generate, make_proposer  # noqa: E402
from decoding.planner import Planner  # noqa: E402
from decoding.stats import StepClock  # noqa: E402
from models.cost import load_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

loaded = load_model("smollm2")
tok = loaded.tokenizer
limit = int(sys.argv[3]) if len(sys.argv) > 3 else 3
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in load_suite(split="test", limit=limit)]
cost = load_step_cost(str(COST))
tag = sys.argv[4] if len(sys.argv) > 4 else root
for name in sys.argv[2].split(","):
    clock = StepClock()
    for p in prompts[:limit]:
        generate(loaded.model, [p], make_proposer(name), max_new_tokens=128,
                 planner=Planner(cost) if name != "ar" else None, step_clock=clock)
    d = clock.per_step()
    print(f"{tag:10s} {name:14s} host {d['host']:.3f} fwd {d['forward']:.3f} "
          + " ".join(f"{k} {d[k]:.3f}" for k in ("plan", "propose", "pack", "verify", "commit", "update")), flush=True)
