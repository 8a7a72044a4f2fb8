"""Variants of our drafters inside vLLM (classes of mixvar.py: other bars, timing of the proposer's
own calls), one after the other in the order given, on the 10 recorded test turns, one thread:

    PYTHONPATH=bench/results/2026-11-26-cpu-context-mix OMP_NUM_THREADS=1 SPECDEC_VLLM_VENV=... \\
        python bench/results/2026-11-26-cpu-context-mix/ab_vllm2.py HybT Hyb01 Mix04 Mix04 Hyb01 HybT
"""
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
import bench.vllm_compare as vc  # noqa: E402

run = json.loads((REPO / "tests/data/vllm_replay_run.json").read_text())
prompts = [r["prompt_ids"] for r in run["requests"]]
py = vc.vllm_python(Path(os.environ["SPECDEC_VLLM_VENV"]) if "SPECDEC_VLLM_VENV" in os.environ else None)
orig = vc.speculative_config
for name in sys.argv[1:]:
    def config(method, k, pld, name=name):
        if method == "x-" + name:
            return {"method": "custom_class", "model": f"mixvar.{name}", "num_speculative_tokens": k}
        return orig(method, k, pld)
    vc.speculative_config = config
    recs = vc.run_method("x-" + name, prompts, 128, 1, model=None, k=10, pld=(3, 10), python=py)["records"]
    vc.speculative_config = orig
    new, fw = sum(len(r["output_ids"]) for r in recs), sum(r["forwards"] for r in recs)
    t, ttft = sum(r["time_s"] for r in recs), sum(r["ttft_s"] for r in recs)
    print(json.dumps(dict(method=name, new=new, forwards=fw, tok_s=round(new / t, 2),
                          decode_ms_per_forward=round((t - ttft) / fw * 1e3, 2), at=time.strftime("%H:%M:%S"))),
          flush=True)
