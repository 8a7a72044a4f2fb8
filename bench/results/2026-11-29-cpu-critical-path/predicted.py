"""The forward time the pinned curve predicts, per task (argv: run folders): each method's for the steps
it sent (its plan's predicted_ms, summed over the batches) against ar's, taken as the one-token steps of
the method's batches (its plan's one_token_ms) scaled by ar's step count over the method's; beside it
the steps ratio and the step tokens per sequence-step. The plans, not the VM's drift."""
import collections
import json
import sys

TASKS = ["chat", "code", "summarization", "qa", "code_edit"]
for run in sys.argv[1:]:
    d = json.load(open(run + "/results.json"))
    agg = collections.defaultdict(collections.Counter)
    for r in d["records"]:
        if not r.get("step_phases"):  # a batch's first record holds the batch's steps and plan
            continue
        k = (r["method"], r["task"])
        agg[k]["steps"] += r["step_phases"]["steps"]
        for f in ("predicted_ms", "one_token_ms", "step_tokens", "seq_steps"):
            agg[k][f] += (r.get("plan") or {}).get(f, 0)
    print(run.rstrip("/").split("/")[-1], "predicted speedup over ar (steps ratio, step tokens per sequence-step):",
          " ".join(TASKS), "all")
    for m in ["pld", "lookahead+pld", "suffix", "hybrid"]:
        row, tot_ar, tot_m = [], 0.0, 0.0
        for t in TASKS:
            a, x = agg[("ar", t)], agg[(m, t)]
            ar_ms = x["one_token_ms"] * a["steps"] / x["steps"]
            tot_ar += ar_ms
            tot_m += x["predicted_ms"]
            per = x["step_tokens"] / x["seq_steps"]
            row.append(f"{ar_ms / x['predicted_ms']:.2f} ({x['steps'] / a['steps']:.2f}, {per:.2f})")
        print(f"  {m:14s} " + "  ".join(row) + f"  all {tot_ar / tot_m:.2f}")
