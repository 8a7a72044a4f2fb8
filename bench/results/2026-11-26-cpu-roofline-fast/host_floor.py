"""Speedup over ar after the first token if every forward ran at the roofline (the emulated
forward divided by the curve's scale) while the host kept its measured ms per step."""
import json, sys
path, scale = sys.argv[1], float(sys.argv[2])
d = json.load(open(path))
agg = {}
for r in d["records"]:
    ph = r.get("step_phases")
    if not ph:
        continue
    m = r["method"]
    a = agg.setdefault(m, {"steps": 0, "fwd": 0.0, "host": 0.0})
    ms = ph["ms"]
    a["steps"] += ph["steps"]
    a["fwd"] += ms.get("forward", 0.0)
    a["host"] += sum(v for k, v in ms.items() if k != "forward")
tok = {}
for r in d["records"]:
    tok[r["method"]] = tok.get(r["method"], 0) + r["new_tokens"]
def t(m, s):
    a = agg[m]
    return a["fwd"] / s + a["host"]
for m in agg:
    emu = (tok[m] / t(m, 1.0)) / (tok["ar"] / t("ar", 1.0))
    flo = (tok[m] / t(m, scale)) / (tok["ar"] / t("ar", scale))
    a = agg[m]
    print(f"{m:14s} steps {a['steps']:5d} fwd/step {a['fwd']/a['steps']:6.2f} host/step {a['host']/a['steps']:5.2f}  emulated {emu:.3f}  at floor {flo:.3f}")
