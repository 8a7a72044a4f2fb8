"""ab.sh's runs side by side: per group (hf: compare-hf --limit 2, pinned curve; free: --limit 1, the
run's own curve; b8: batches of 8, pinned curve) and method, every round's speedup over ar after the
first token and of the whole turn, tau, and query tokens per sequence step, before / after, then
the medians. Reads the runs' results.md. Usage: python summarize.py [DIR]"""
import glob
import re
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)


def table(lines, start):
    i = next(k for k, line in enumerate(lines) if line == start or (start.endswith(" ") and line.startswith(start)))
    j = next(k for k in range(i, len(lines)) if lines[k].startswith("| method"))
    out = {}
    for line in lines[j + 2:]:
        if not line.startswith("|"):
            break
        c = [x.strip() for x in line.strip("|").split("|")]
        out[c[0]] = c
    return out


res = {}
for f in sorted(glob.glob(str(HERE / "*-before/results.md")) + glob.glob(str(HERE / "*-after/results.md"))
           + glob.glob(str(HERE / "*-slopefree/results.md"))):
    run = Path(f).parent.name
    group, rnd, side = re.match(r"([a-z]+8?)-?(\d+)-(before|after|slopefree)", run).groups()
    lines = open(f).read().split("\n")
    after = table(lines, "### speedup over ar after the first token ")
    whole = table(lines, "### speedup over ar")
    tau = table(lines, "### tau ")
    plan = table(lines, "| method | query tokens / sequence step ")
    for m in after:
        d = res.setdefault(group, {}).setdefault(m, {}).setdefault(side, [])
        q = plan[m][1] if m in plan else "1.0"
        d.append((float(after[m][-1]) if after[m][-1] != "-" else float("nan"), float(whole[m][-1]),
                  float(tau[m][-1]), float(q)))
for group, methods in res.items():
    SIDES = [s for s in ("before", "after", "slopefree") if any(s in d for d in methods.values())]
    print(f"## {group}\n")
    print("| method | " + " | ".join(f"{what}, {s}" for what in ("after the first token", "whole turn", "tau",
                                                                  "query tokens / step") for s in SIDES) + " |")
    print("|---" * (1 + 4 * len(SIDES)) + "|")
    for m, sides in methods.items():
        cells = []
        for k in range(4):
            for side in SIDES:
                v = [r[k] for r in sides.get(side, [])]
                cells.append(" ".join(f"{x:.2f}" for x in v) + (f" (**{statistics.median(v):.2f}**)" if len(v) > 1
                                                                  else ""))
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
