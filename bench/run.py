"""End-to-end benchmark: decoding methods x tasks on real prompts.

    python bench/run.py                                   # default suite, default model
    python bench/run.py --kernel triton --methods ar,pld,lookahead+pld --tasks summarization
    python bench/run.py --prompts my.jsonl --compare-hf --out out/mine

Writes OUT/results.json (one record per prompt and method), OUT/results.md (tables) and
OUT/chart.png (speedup and tau per task per method), and prints the tables.
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

ALL_METHODS = ("ar", "pld", "jacobi", "lookahead", "lookahead+pld", "recycle", "suffix", "hybrid", "draft")


def parse_args(argv=None):
    from decoding.options import add_decoding_flags, add_model_flags, check

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    add_decoding_flags(p)
    p.add_argument("--methods", default="ar,pld,jacobi,lookahead,lookahead+pld,recycle,suffix,hybrid",
                   help=f"comma list from {','.join(ALL_METHODS)} (ar is always run: it is the baseline)")
    p.add_argument("--tasks", default=None, help="comma list of suite tasks (default: all)")
    p.add_argument("--prompts", type=Path, default=None, help="your own JSONL prompt file instead of the suite")
    p.add_argument("--split", default="test", choices=("dev", "test"), help="suite split (tune on dev)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (32 with interpreted Triton)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts of one task decoded together (default 1)")
    p.add_argument("--limit", type=int, default=None,
                   help="prompts per task (default: all on a GPU, 1 on a CPU)")
    p.add_argument("--out", type=Path, default=Path("bench/out"), help="folder for results.json/.md and chart.png")
    p.add_argument("--compare-hf", action="store_true",
                   help="also run transformers generate (greedy and prompt lookup) on the same prompts")
    args = p.parse_args(argv)
    try:
        check(args)
    except ValueError as e:
        p.error(str(e))
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.methods if m not in ALL_METHODS]
    if bad:
        p.error(f"--methods: unknown {bad}; choose from {','.join(ALL_METHODS)}")
    if "ar" not in args.methods:
        args.methods.insert(0, "ar")
    if "draft" in args.methods and not args.draft_model:
        p.error("--methods draft needs --draft-model (a smaller model with the same tokenizer)")
    if args.prompts is not None and not args.prompts.is_file():
        p.error(f"--prompts {args.prompts}: no such file")
    for name in ("batch_size", "limit", "max_new_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    args.interpreted = args.kernel == "triton" and not args.device.startswith("cuda")
    if args.max_new_tokens is None:
        args.max_new_tokens = 32 if args.interpreted else 128
    if args.limit is None and args.prompts is None and not args.device.startswith("cuda"):
        args.limit = 1
    return args


def load_records(args) -> list[dict]:
    """Prompt records with their first-turn messages; chat records keep both turns."""
    from bench.data.suite import load_prompt_file, load_suite

    tasks = args.tasks.split(",") if args.tasks else None
    if args.prompts is not None:
        out, taken = [], {}
        for r in load_prompt_file(args.prompts):  # raises ValueError naming the line
            if tasks and r["task"] not in tasks:
                continue
            taken[r["task"]] = taken.get(r["task"], 0) + 1
            if args.limit is None or taken[r["task"]] <= args.limit:
                out.append({"id": r["id"], "task": r["task"], "messages": r["messages"], "next_turn": None})
        return out
    out = []
    for r in load_suite(tasks=tasks, split=args.split, limit=args.limit):
        first = r["turns"][0] if r["task"] == "chat" else r["prompt"]
        out.append({"id": r["id"], "task": r["task"], "messages": [{"role": "user", "content": first}],
                    "next_turn": r["turns"][1] if r["task"] == "chat" else None})
    return out


def header(args, model, device_name) -> dict:
    import transformers
    import triton

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python bench/run.py"] + sys.argv[1:]),
        "device": device_name, "dtype": args.dtype,
        "kernel": args.kernel + (" (Triton interpreter on the CPU: kernels are emulated, timings say nothing "
                                 "about Triton speed)" if args.interpreted else ""),
        "model": f"{args.model} ({model.cfg.architecture}, {model.cfg.num_layers} layers, "
                 f"hidden {model.cfg.hidden_size})",
        "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "sampling": "greedy" if args.temperature == 0 else
                    f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}, seed {args.seed}",
        "lookahead W,N,G": args.lookahead, "pld max_ngram,draft": args.pld,
        "step planner": "off" if args.no_plan else "on (measured step cost)",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}, "
                    f"transformers {transformers.__version__}",
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpreted:
        # Triton decides at import time: switch the interpreter on before `kernels` is imported.
        os.environ["TRITON_INTERPRET"] = "1"
        print("NOTE: --kernel triton without a GPU runs the Triton kernels in Triton's interpreter: correct but "
              f"slow; the workload is capped ({args.max_new_tokens} new tokens, {args.limit} prompt(s) per task).")
    from tqdm import tqdm

    from bench.hf_compare import HF_METHODS, hf_generate, load_hf_model
    from bench.report import chart, markdown
    from decoding.generate import generate
    from decoding.options import DTYPES, build_proposer, sampling_of
    from decoding.planner import Planner
    from kernels.backend import get_backend
    from models.cost import step_cost
    from models.loader import DEFAULT_CACHE_DIR, load_model, resolve_model_path

    records = load_records(args)  # a malformed prompt file fails here, before any model is loaded
    if not records:
        print("no prompts selected", file=sys.stderr)
        return 2
    backend = get_backend(args.kernel, args.device)
    dtype = DTYPES[args.dtype]
    model, tok = load_model(args.model, backend, dtype, args.device)
    draft = load_model(args.draft_model, backend, dtype, args.device)[0] if "draft" in args.methods else None
    eos = tuple(model.cfg.eos_token_ids)
    sp = sampling_of(args)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
        f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    methods = list(args.methods)
    hf = None
    if args.compare_hf:
        hf = load_hf_model(resolve_model_path(args.model), dtype, args.device)
        methods += list(HF_METHODS)

    def encode(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    skipped = []

    def too_long(rec) -> Optional[str]:
        n, ctx = len(encode(rec["messages"])), model.cfg.max_position_embeddings
        if n + args.max_new_tokens <= ctx:
            return None
        return (f"record {rec['id']} ({rec['task']}): prompt of {n} tokens + --max-new-tokens {args.max_new_tokens} "
                f"exceeds the model context of {ctx} tokens; skipped")

    def fits(rec) -> bool:
        """A prompt the model's context cannot hold is reported (by record) and skipped; the
        other records go on."""
        msg = too_long(rec)
        if msg is None:
            return True
        print(f"error: {msg}", file=sys.stderr)
        skipped.append(msg)
        bar.update(1)
        return False

    cost = None if args.no_plan else step_cost(model, DEFAULT_CACHE_DIR)

    def run(name, prompts, max_new_tokens):
        plan = Planner(cost) if cost is not None and name != "ar" else None
        res = generate(model, prompts, build_proposer(name, args, draft), max_new_tokens=max_new_tokens,
                       sampling=sp, planner=plan)
        return res, (plan.log if plan is not None else None)

    # warm-up, every method: first calls pay for allocation (and on a GPU compilation)
    shortest = min((r for r in records if too_long(r) is None), key=lambda r: len(encode(r["messages"])), default=None)
    for name in args.methods:
        if shortest is not None:
            run(name, [encode(shortest["messages"])], 4)

    results, todo = [], list(records)
    bar = tqdm(total=len(todo) + sum(r.get("next_turn") is not None for r in records), desc="prompts")
    while todo:
        # batches of prompts of one task (the second chat turns come back as new records)
        by_task: dict[str, list] = {}
        for r in todo:
            by_task.setdefault(r["task"], []).append(r)
        todo, follow = [], []
        for task, recs in by_task.items():
            recs = [r for r in recs if fits(r)]
            for i in range(0, len(recs), args.batch_size):
                batch = recs[i:i + args.batch_size]
                prompts = [encode(r["messages"]) for r in batch]
                ar_out = None
                for name in args.methods:  # methods back to back on the same batch
                    t0 = time.perf_counter()
                    res, plan_log = run(name, prompts, args.max_new_tokens)
                    if args.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    secs = time.perf_counter() - t0
                    if name == "ar":
                        ar_out = [x.output_ids for x in res]
                    for r, p, x, ref in zip(batch, prompts, res, ar_out):
                        results.append(_record(r, name, p, x.output_ids, x.stats.forwards, secs, res, sp, ref,
                                               x.finish_reason, x.stats.as_dict(), x.stats.step_tokens, plan_log))
                if hf is not None:
                    for r, p, ref in zip(batch, prompts, ar_out):
                        for name in HF_METHODS:
                            h = hf_generate(hf, p, name, args.max_new_tokens, eos)
                            results.append(_record(r, name, p, h["output_ids"], h["forwards"], h["time_s"], None,
                                                   sp, ref, h["finish_reason"], None, None, None))
                for r, out in zip(batch, ar_out):
                    if r.get("next_turn"):  # MT-bench turn 2 sees the model's own first answer
                        answer = tok.decode(out, skip_special_tokens=True)
                        follow.append({"id": r["id"] + "-turn2", "task": r["task"], "next_turn": None,
                                       "messages": r["messages"] + [{"role": "assistant", "content": answer},
                                                                    {"role": "user", "content": r["next_turn"]}]})
                bar.update(len(batch))
        todo = follow
    bar.close()

    args.out.mkdir(parents=True, exist_ok=True)
    head = header(args, model, device_name)
    if cost is not None:
        head["step cost"] = (f"forward ms at T step tokens (batch 1, context {cost.context}): "
                             + ", ".join(f"{t}: {m:.1f}" for t, m in zip(cost.tokens, cost.ms))
                             + f"; +{cost.per_seq_ms:.2f} ms per extra sequence"
                             + (f"; at context {cost.long_context}: "
                                + ", ".join(f"{t}: {m:.1f}" for t, m in zip(cost.long_tokens, cost.long_ms))
                                if cost.long_context else ""))
        head["step_cost_curve"] = {"tokens": cost.tokens, "ms": cost.ms, "per_seq_ms": cost.per_seq_ms,
                                   "long_context": cost.long_context, "long_tokens": cost.long_tokens,
                                   "long_ms": cost.long_ms}
    if skipped:
        head["skipped"] = skipped
    tasks = list(dict.fromkeys(r["task"] for r in results))
    (args.out / "results.json").write_text(json.dumps({"header": head, "records": results}, indent=1))
    md = markdown(results, head, [m for m in methods if any(r["method"] == m for r in results)], tasks)
    (args.out / "results.md").write_text(md)
    chart(results, methods, tasks, args.out / "chart.png", f"{args.model} | {device_name} | {args.dtype} | {args.kernel}",
          head.get("step_cost_curve"))
    print(md)
    print(f"\nwrote {args.out / 'results.json'}, {args.out / 'results.md'}, {args.out / 'chart.png'}")
    return 0


def _record(rec, method, prompt, output_ids, forwards, secs, batch_results, sp, ar_ids, finish, stats, step_tokens,
            plan_log):
    """One results.json record. A batch shares its wall time: time_s and tok_s are the batch's;
    ``plan`` is the batch's step-planner log (totals over its steps)."""
    batch_new = sum(len(x.output_ids) for x in batch_results) if batch_results else len(output_ids)
    return {
        "id": rec["id"], "task": rec["task"], "method": method, "prompt_tokens": len(prompt),
        "new_tokens": len(output_ids), "forwards": forwards, "tau": len(output_ids) / max(forwards, 1),
        "time_s": secs * len(output_ids) / max(batch_new, 1),  # this sequence's share of the batch time
        "tok_s": batch_new / secs if secs > 0 else None,
        "step_tokens": step_tokens,
        "identical_to_ar": (output_ids == ar_ids) if sp.greedy else None,
        "finish_reason": finish, "stats": stats, "plan": plan_log, "output_ids": output_ids,
    }


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:  # bad input (prompt file, model path, configuration): say what, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
