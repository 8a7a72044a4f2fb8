"""host_ab.txt summarized: per method, before / now, the host ms a step (min and median of the
rounds) and each phase's median (ms)."""
import collections
import statistics
import sys
from pathlib import Path

PHASES = ("plan", "propose", "pack", "verify", "commit", "update", "host")
runs = collections.defaultdict(list)
name = sys.argv[1] if len(sys.argv) > 1 else "host_ab.txt"
for line in (Path(__file__).parent / name).read_text().splitlines():
    side = line.split()[0]
    cells = [c.strip() for c in line.split("|")]
    runs[cells[1], side].append(dict(zip(PHASES, map(float, cells[3:10]))))
print("| method | host before min / median | host now min / median | "
      + " | ".join(f"{p} before / now" for p in PHASES[:-1]) + " |")
print("|---|---|---|" + "---:|" * (len(PHASES) - 1))
for method in dict.fromkeys(m for m, _ in runs):
    b, n = runs[method, "before"], runs[method, "now"]
    med = {side: {p: statistics.median(r[p] for r in rs) for p in PHASES} for side, rs in (("b", b), ("n", n))}
    print(f"| {method} | {min(r['host'] for r in b):.3f} / {med['b']['host']:.3f} | "
          f"{min(r['host'] for r in n):.3f} / {med['n']['host']:.3f} | "
          + " | ".join(f"{med['b'][p]:.3f} / {med['n'][p]:.3f}" for p in PHASES[:-1]) + " |")
