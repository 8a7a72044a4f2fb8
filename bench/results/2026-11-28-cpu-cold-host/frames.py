"""Python frames (function calls, comprehensions included) per decoding step in the real loop, by
phase, the forward's and the prefill's excluded: 2 prompts of the suite's test split, 128 tokens,
each method planned with the pinned curve of ../2026-11-28-cpu-host-split (ar: none). The counts
are deterministic; the probe's own StepClock.mark wrapper adds one frame per phase (6 a step).

    python bench/results/2026-11-28-cpu-cold-host/frames.py METHODS [ROOT] [detail]

ROOT: the repository whose code runs (default this one).
"""
import collections
import importlib
import sys
from pathlib import Path

COST = Path(__file__).resolve().parent.parent / "2026-11-28-cpu-host-split" / "pinned_step_cost.json"
sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).resolve().parents[3]))
G = importlib.import_module("decoding.generate")
from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import make_proposer  # noqa: E402
from decoding.planner import Planner  # noqa: E402
from decoding.stats import StepClock  # noqa: E402
from models.cost import load_step_cost  # noqa: E402
from models.loader import load_model  # noqa: E402

loaded = load_model("smollm2")
tok = loaded.tokenizer
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in load_suite(split="test", limit=1)][:2]
cost = load_step_cost(str(COST))
phase = ["loop"]
mark_of = StepClock.mark


def mark(self, p):
    mark_of(self, p)
    phase[0] = {"pack": "forward", "update": "loop"}.get(p, "after-" + p)


StepClock.mark = mark
counts = collections.Counter()


def prof(frame, event, arg):
    if event == "call" and phase[0] != "forward":
        counts[(phase[0], frame.f_code.co_filename.split("/")[-1], frame.f_code.co_name)] += 1


prefill_of = G._Batch.prefill


def prefill(self, *a):
    sys.setprofile(None)
    prefill_of(self, *a)
    sys.setprofile(prof)


G._Batch.prefill = prefill
detail = len(sys.argv) > 3
for name in sys.argv[1].split(","):
    counts.clear()
    clock = StepClock()
    for p in prompts:
        phase[0] = "loop"
        sys.setprofile(prof)
        G.generate(loaded.model, [p], make_proposer(name), max_new_tokens=128,
                   planner=Planner(cost) if name != "ar" else None, step_clock=clock)
        sys.setprofile(None)
    steps = clock.steps
    tot = collections.Counter()
    for k, v in counts.items():
        tot[k[0]] += v
    print(f"{name}: {sum(tot.values()) / steps:.1f} frames a step: "
          + ", ".join(f"{k} {v / steps:.1f}" for k, v in tot.items()))
    if detail:
        for k, v in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1])):
            if v >= 0.5 * steps:
                print(f"    {v / steps:5.2f} {k}")
