"""attention.txt -> a table: per keys, rows and cache state, the fastest call of each round (us),
the start code's and this code's, median over the rounds, and their ratio."""
import re
import statistics
from pathlib import Path

runs = {}
for line in Path(__file__).with_name("attention.txt").read_text().splitlines():
    m = re.match(r"round \d+ (\w+) (hot|L3|cold)\s+T=(\d+) L=(\d+) fastest ([\d.]+) us", line)
    if m:
        side, mode, t, keys, us = m.groups()
        runs.setdefault((int(keys), int(t), mode, side), []).append(float(us))
print("| keys | rows | state | before us | now us | now / before |")
print("|---:|---:|---|---:|---:|---:|")
for keys, t, mode in sorted({k[:3] for k in runs}, key=lambda k: (k[0], ["hot", "L3", "cold"].index(k[2]), k[1])):
    b, n = statistics.median(runs[keys, t, mode, "before"]), statistics.median(runs[keys, t, mode, "now"])
    print(f"| {keys} | {t} | {mode} | {b:.1f} | {n:.1f} | {n / b:.2f} |")

# forward_ab.txt: model_speed.py's forward ms (decode at batch 1 and 8; steps of 1, 4, 8 tokens at
# batch 1) and the layer stack's attention phase (ms a forward, fastest profiled forward)
fwd, att, side = {}, {}, None
for line in Path(__file__).with_name("forward_ab.txt").read_text().splitlines():
    if line.startswith("== round"):
        side = line.split()[-1]
        continue
    cells = [c.strip() for c in line.strip("|").split("|")]
    if len(cells) == 10 and cells[1] == "512":  # decode: batch, context, forward ms, ...
        fwd.setdefault((f"decode, batch {cells[0]}", side), []).append(float(cells[2]))
    elif len(cells) == 8:  # step cost: batch, step tokens, forward ms, ...
        fwd.setdefault((f"{cells[1]} tokens, batch 1", side), []).append(float(cells[2]))
    elif len(cells) == 14 and cells[0] == "active" and cells[1] == "1":  # phases
        att.setdefault((f"{cells[2]} tokens, batch 1", side), []).append(float(cells[6]))
print()
print("| step | forward before ms | now ms | now / before | attention before ms | now ms | now / before |")
print("|---|---:|---:|---:|---:|---:|---:|")
for step in dict.fromkeys(k[0] for k in fwd):
    fb, fn = statistics.median(fwd[step, "before"]), statistics.median(fwd[step, "now"])
    a = [statistics.median(att[step, s]) for s in ("before", "now")] if (step, "now") in att else None
    tail = f"{a[0]:.2f} | {a[1]:.2f} | {a[1] / a[0]:.2f}" if a else "- | - | -"
    print(f"| {step} | {fb:.2f} | {fn:.2f} | {fn / fb:.2f} | {tail} |")

# variants.txt: us a call (fastest of each round, median over rounds) per variant, 512 keys
var = {}
for line in Path(__file__).with_name("variants.txt").read_text().splitlines():
    m = re.match(r"round \d+ (\w+) (hot|L3|cold)\s+T=(\d+) L=\d+ fastest ([\d.]+) us", line)
    if m:
        name, mode, t, us = m.groups()
        var.setdefault((name, mode, int(t)), []).append(float(us))
names = list(dict.fromkeys(k[0] for k in var))
print()
print("| 512 keys | " + " | ".join(names) + " |")
print("|---|" + "---:|" * len(names))
for mode in ("hot", "L3", "cold"):
    for t in (1, 4, 8, 16):
        print(f"| {mode}, {t} rows | " + " | ".join(f"{statistics.median(var[n, mode, t]):.1f}" for n in names) + " |")
