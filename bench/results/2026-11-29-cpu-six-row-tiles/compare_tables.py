"""The compare-hf runs side by side: per method, the speedup over ar after the first token by task and
over all tasks, tau over all tasks, and the step clock's forward and host ms a step; per run folder named."""

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


for run in sys.argv[1:]:
    md = (Path(run) / "results.md").read_text()
    after = table(md, "speedup over ar after the first token")
    tau = table(md, "tau (new tokens per forward)")
    steps = table(md, "where a decoding step's time goes")
    print(f"{run}:")
    for m in ("ar", "pld", "lookahead+pld", "suffix", "hybrid"):
        s = steps[m]
        tasks = " ".join(after[m][1:6])
        print(f"  {m:14s} after first {tasks} all {after[m][6]}  tau {tau[m][6]}  fwd {s[2]} host {s[9]}")
