"""Our two chain drafters inside vLLM, alternated: vllm-specdec (the hybrid's best chain) and
vllm-specdec-mix (the context mixture), two rounds, on the 10 recorded test turns
(tests/data/vllm_replay_run.json), one thread. Run from the repository root:

    OMP_NUM_THREADS=1 SPECDEC_VLLM_VENV=... python bench/results/2026-11-26-cpu-context-mix/ab_vllm.py

(run before the methods were renamed: vllm-specdec was then the mixture and vllm-specdec-hybrid
the hybrid; the rows of ab_vllm_runs.jsonl carry those names)."""
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from bench.vllm_compare import run_method, vllm_python  # noqa: E402

run = json.loads((REPO / "tests/data/vllm_replay_run.json").read_text())
prompts = [r["prompt_ids"] for r in run["requests"]]
py = vllm_python(Path(os.environ["SPECDEC_VLLM_VENV"]) if "SPECDEC_VLLM_VENV" in os.environ else None)
for rnd in range(2):
    for m in ("vllm-specdec-mix", "vllm-specdec"):
        recs = run_method(m, prompts, 128, 1, model=None, k=10, pld=(3, 10), python=py)["records"]
        new, fw = sum(len(r["output_ids"]) for r in recs), sum(r["forwards"] for r in recs)
        t, ttft = sum(r["time_s"] for r in recs), sum(r["ttft_s"] for r in recs)
        print(json.dumps(dict(round=rnd, method=m, new=new, forwards=fw, tok_s=round(new / t, 2),
                              decode_ms_per_forward=round((t - ttft) / fw * 1e3, 2), at=time.strftime("%H:%M:%S"))),
              flush=True)
