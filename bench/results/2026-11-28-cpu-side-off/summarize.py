"""The e2e runs side by side: per method (all tasks), decode tok/s after the first token (new tokens
- 1 over time - TTFT, summed over prompts), whole-turn tok/s, forward ms a step (step clock), tau,
and every output's identity to `ar`. Usage: python summarize.py DIR... (run from this folder)."""
import json
import sys

rows = {}
for d in sys.argv[1:]:
    recs = json.load(open(f"{d}/results.json"))["records"]
    for m in dict.fromkeys(r["method"] for r in recs):
        rs = [r for r in recs if r["method"] == m]
        if any(r.get("step_phases") is None for r in rs):  # transformers' rows: no step clock
            continue
        dec = sum(r["new_tokens"] - 1 for r in rs) / sum(r["time_s"] - r["ttft_s"] for r in rs)
        whole = sum(r["new_tokens"] for r in rs) / sum(r["time_s"] for r in rs)
        steps = sum(r["step_phases"]["steps"] for r in rs)
        fwd = sum(r["step_phases"]["ms"]["forward"] for r in rs) / steps
        tau = sum(r["new_tokens"] for r in rs) / sum(r["forwards"] for r in rs)
        same = all(r["identical_to_ar"] for r in rs)
        rows.setdefault(m, []).append((d, dec, whole, fwd, tau, same))
print("| method | " + " | ".join(sys.argv[1:]) + " |")
print("|---|" + "---|" * len(sys.argv[1:]))
ar = {d: dec for d, dec, *_ in rows["ar"]}
for m, vals in rows.items():
    print(f"| {m} | " + " | ".join(f"{dec:.1f} ({dec / ar[d]:.2f}x), {whole:.1f}, {fwd:.2f} ms, tau {tau:.2f}"
                                     f"{'' if same else ' DIFFERS'}" for d, dec, whole, fwd, tau, same in vals) + " |")
