"""The A/B's runs side by side (run from the repository root): per method, the speedup over ar after the
first token (decoding alone: each batch's time after its prefill) per task and over all, and the whole
turn's over all; then the medians over the rounds of each side."""
import json
import statistics
from pathlib import Path

from bench.report import summarize

HERE = Path(__file__).parent
TASKS = ["chat", "code", "summarization", "qa", "code_edit", "all"]
METHODS = ["pld", "lookahead+pld", "suffix", "hybrid"]
runs = sorted(p.name for p in HERE.iterdir() if p.is_dir() and (p / "results.json").is_file()
              and p.name.split("-")[0] in ("before", "after"))
got = {}
for name in list(runs):
    d = json.loads((HERE / name / "results.json").read_text())
    if "incomplete" in d["header"]:  # a run still going
        runs.remove(name)
        continue
    got[name] = summarize(d["records"], d["header"]["batch_size"])
print("speedup over ar after the first token: " + " ".join(TASKS) + " | whole turn, all")
for m in METHODS:
    for name in runs:
        s = got[name]
        print(f"{m:14s} {name:9s} " + " ".join(f"{s[(m, t)]['decode_speedup']:.2f}" for t in TASKS)
              + f" | {s[(m, 'all')]['speedup']:.2f}")
print("\nmedian over the rounds (after the first token, all | whole turn, all)")
for m in METHODS:
    row = []
    for side in ("before", "after"):
        names = [n for n in runs if n.startswith(side + "-")]
        dec = statistics.median(got[n][(m, "all")]["decode_speedup"] for n in names)
        whole = statistics.median(got[n][(m, "all")]["speedup"] for n in names)
        row.append(f"{side} {dec:.2f} | {whole:.2f} ({len(names)} rounds)")
    print(f"{m:14s} " + "   ".join(row))
