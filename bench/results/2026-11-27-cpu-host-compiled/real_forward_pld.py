"""pld with the real forward (fp32, the default model, 5 prompts, 128 new tokens), the planner as
the benchmark runs it (measured step cost, the host's time learned), on the compiled host path
and the reference, alternated twice in one process: wall time, forwards, step tokens sent and
the step clock's phases per step.

    flock /tmp/timing.lock python bench/results/2026-11-27-cpu-host-compiled/real_forward_pld.py
"""

import sys
import time

sys.path.insert(0, ".")

from bench.data.suite import load_suite, user_turns  # noqa: E402
from decoding import compiled, generate, make_proposer  # noqa: E402
from decoding.options import planner_for  # noqa: E402
from decoding.stats import StepClock  # noqa: E402
from models.cost import step_cost  # noqa: E402
from models.loader import DEFAULT_CACHE_DIR, load_model  # noqa: E402

lm = load_model("smollm2")
model, tok = lm.model, lm.tokenizer
prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for r in load_suite(split="test", limit=1)]
cost = step_cost(model, DEFAULT_CACHE_DIR)
for rnd in range(2):
    for path in ("compiled", "reference"):
        compiled.use_compiled(path == "compiled")
        clock, t0, forwards, sent = StepClock(), time.perf_counter(), 0, 0
        for p in prompts:
            plan = planner_for(model, "pld", False, DEFAULT_CACHE_DIR, cost=cost)
            out = generate(model, [p], make_proposer("pld"), max_new_tokens=128, planner=plan, step_clock=clock)[0]
            forwards += out.stats.forwards
            sent += plan.log["step_tokens"]
        phases = {k: round(v, 3) for k, v in clock.per_step().items()}
        print(path, round(time.perf_counter() - t0, 2), "s", forwards, "forwards", sent, "step tokens", phases)
