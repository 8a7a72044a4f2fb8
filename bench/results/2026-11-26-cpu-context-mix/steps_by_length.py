"""vLLM's engine step time by the length of the draft the step verifies: in-process vLLM, one
thread, the 10 recorded test turns, one engine per class of mixvar.py (MixL, HybL log each call's
draft lengths):

    OMP_NUM_THREADS=1 SPECDEC_VLLM_VENV=... python bench/results/2026-11-26-cpu-context-mix/steps_by_length.py \\
        parent MixL HybL

Prints, per class, {draft length: [steps, median step ms]} (steps_by_length_runs.jsonl)."""
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))


def parent(classes):
    from bench.vllm_compare import child_env, vllm_python

    py = vllm_python(Path(os.environ["SPECDEC_VLLM_VENV"]) if "SPECDEC_VLLM_VENV" in os.environ else None)
    for cls in classes:
        env = child_env(1, py)
        env["PYTHONPATH"] = str(HERE) + os.pathsep + env["PYTHONPATH"]
        p = subprocess.run([str(py), __file__, "child", cls], env=env, capture_output=True, text=True, cwd=str(REPO))
        print(p.stdout.strip().splitlines()[-1] if p.returncode == 0 else p.stderr[-3000:], flush=True)


def child(cls):
    import mixvar
    from vllm import LLM, SamplingParams

    from decoding.vllm import vllm_model_folder

    run = json.loads((REPO / "tests/data/vllm_replay_run.json").read_text())
    prompts = [r["prompt_ids"] for r in run["requests"]]
    llm = LLM(model=str(vllm_model_folder()), dtype="float32", seed=0, max_num_seqs=1, enable_prefix_caching=False,
              speculative_config={"method": "custom_class", "model": f"mixvar.{cls}", "num_speculative_tokens": 10})
    eng = llm.llm_engine
    by = collections.defaultdict(list)

    def one(ids, max_tokens, rid, record):
        eng.add_request(rid, {"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        first = True
        while eng.has_unfinished_requests():
            pending = mixvar.LAST[-1][0] if mixvar.LAST and mixvar.LAST[-1] else 0  # the draft this step verifies
            t = time.perf_counter()
            eng.step()
            dt = time.perf_counter() - t
            if record and not first:
                by[pending].append(dt)
            first = False

    one(min(prompts, key=len), 4, "w", False)
    for i, ids in enumerate(prompts):
        one(ids, 128, f"p{i}", True)
    print(json.dumps({"cls": cls, "by_len": {k: (len(v), round(sorted(v)[len(v) // 2] * 1e3, 1))
                                             for k, v in sorted(by.items())}}))


if __name__ == "__main__":
    parent(sys.argv[2:]) if sys.argv[1] == "parent" else child(sys.argv[2])
