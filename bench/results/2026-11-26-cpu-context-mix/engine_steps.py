"""Our drafters inside vLLM timed per engine step (eng.step(), the prefill step left out), one engine
per class, in the order given, on the 10 recorded test turns, one thread:

    OMP_NUM_THREADS=1 SPECDEC_VLLM_VENV=... python bench/results/2026-11-26-cpu-context-mix/engine_steps.py \\
        parent decoding.vllm.MixProposer decoding.vllm.HybridProposer decoding.vllm.MixProposer ...

The first run of engine_steps_runs.jsonl also ran the prompts a second time in the same engine
(pass1: the shared store then holds every answer)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))


def parent(classes):
    from bench.vllm_compare import child_env, vllm_python

    py = vllm_python(Path(os.environ["SPECDEC_VLLM_VENV"]) if "SPECDEC_VLLM_VENV" in os.environ else None)
    for cls in classes:
        p = subprocess.run([str(py), __file__, "child", cls], env=child_env(1, py), capture_output=True, text=True,
                           cwd=str(REPO))
        print(p.stdout.strip().splitlines()[-1] if p.returncode == 0 else p.stderr[-2000:], flush=True)


def child(cls):
    from vllm import LLM, SamplingParams

    from decoding.vllm import vllm_model_folder

    run = json.loads((REPO / "tests/data/vllm_replay_run.json").read_text())
    prompts = [r["prompt_ids"] for r in run["requests"]]
    llm = LLM(model=str(vllm_model_folder()), dtype="float32", seed=0, max_num_seqs=1, enable_prefix_caching=False,
              speculative_config={"method": "custom_class", "model": cls, "num_speculative_tokens": 10})
    eng = llm.llm_engine

    def one(ids, max_tokens, rid):
        eng.add_request(rid, {"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        steps, first = [], True
        while eng.has_unfinished_requests():
            t = time.perf_counter()
            eng.step()
            dt = time.perf_counter() - t
            if not first:
                steps.append(dt)
            first = False
        return steps

    one(min(prompts, key=len), 4, "w")
    st = sorted(x for i, ids in enumerate(prompts) for x in one(ids, 128, f"p{i}"))
    print(json.dumps({"cls": cls, "pass0": dict(steps=len(st), total_s=round(sum(st), 2),
                                                median_ms=round(st[len(st) // 2] * 1e3, 2),
                                                top5_ms=[round(x * 1e3) for x in st[-5:]])}))


if __name__ == "__main__":
    parent(sys.argv[2:]) if sys.argv[1] == "parent" else child(sys.argv[2])
