"""Per call, in the real decoding loop (the default model's forward between steps): the median
time of the step's packing (models.packing.pack, ModelRunner.prepare), the head-screen check and
_step_input (pack_alone.py times the packing alone). python real_loop_calls.py ar (needs
/tmp/host_step_answers.json for its prompts: bench/host_step.py --answers writes it)."""
import sys
import time
import functools
import json
sys.path.insert(0, '.')
from models.loader import load_model
from decoding import generate, make_proposer
from decoding.stats import StepClock
import models.runner as MR
import models.packing as PK
sys.modules.setdefault('decoding.generate', sys.modules['decoding.generate'])
G = sys.modules['decoding.generate']
acc = {}
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc.setdefault(label, []).append(time.perf_counter() - t)
    setattr(obj, name, w)
wrap(MR.ModelRunner, "prepare", "prepare")
wrap(PK, "pack", "pack")
wrap(MR.ModelRunner, "head_screen", "head_screen")
wrap(G, "_step_input", "_step_input")
wrap(MR.ModelRunner, "forward", "forward")
loaded = load_model("smollm2")
saved = json.load(open('/tmp/host_step_answers.json'))
prompts = saved['prompts']
for m in sys.argv[1:]:
    for r in range(2):
        acc.clear()
        clock = StepClock()
        generate(loaded.model, prompts[:2], make_proposer(m), max_new_tokens=128, step_clock=clock)
        ps = clock.per_step()
        print(m, {k: round(v, 4) for k, v in ps.items()})
        for k, ts in acc.items():
            ts = sorted(ts)
            print(f"   {k:12s} {len(ts):5d} median {ts[len(ts)//2]*1e6:8.1f} p10 {ts[len(ts)//10]*1e6:8.1f} "
                  f"p90 {ts[9*len(ts)//10]*1e6:8.1f} us")
