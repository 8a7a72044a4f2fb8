"""The compare-hf runs' tables side by side: per method, speedup over ar whole turns / after the first
token, tau, and the step clock's forward and host ms a step (all tasks), for each run folder named."""
import sys
from pathlib import Path


def table(md, title):
    lines = md.split(f"### {title}", 1)[1].splitlines()
    rows = {}
    for line in lines[1:]:
        if line.startswith("###"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("method", "") and not cells[0].startswith("-"):
            rows[cells[0]] = cells
    return rows


runs = sys.argv[1:]
print("| method | " + " | ".join(runs) + " |")
print("|---|" + "---|" * len(runs))
data = []
for run in runs:
    md = (Path(__file__).parent / run / "results.md").read_text()
    data.append((table(md, "speedup over ar\n"), table(md, "speedup over ar after the first token"),
                 table(md, "tau (new tokens per forward)"), table(md, "where a decoding step's time goes")))
for method in ("ar", "pld", "lookahead+pld", "suffix", "hybrid"):
    cells = []
    for whole, after, tau, steps in data:
        s = steps[method]
        cells.append(f"{whole[method][-1]} / {after[method][-1]}, tau {tau[method][-1]}, fwd {s[2]} host {s[9]}")
    print(f"| {method} | " + " | ".join(cells) + " |")
