"""Speedup over ar after the first token if every forward ran at the roofline itself: an
--emulate-cost run's forward ms per step divided by the curve's scale, the host's measured ms per
step kept (the run's step_phases).

    python host_floor.py roofline50/results.json 2.35
"""

import json
import sys


def main() -> None:
    path, scale = sys.argv[1], float(sys.argv[2])
    d = json.load(open(path))
    agg, tokens = {}, {}
    for r in d["records"]:
        tokens[r["method"]] = tokens.get(r["method"], 0) + r["new_tokens"]
        ph = r.get("step_phases")
        if not ph:
            continue
        a = agg.setdefault(r["method"], {"steps": 0, "fwd": 0.0, "host": 0.0})
        a["steps"] += ph["steps"]
        a["fwd"] += ph["ms"].get("forward", 0.0)
        a["host"] += sum(v for k, v in ph["ms"].items() if k != "forward")

    def speed(m, s):  # new tokens per ms of decoding steps, forwards divided by s
        return tokens[m] / (agg[m]["fwd"] / s + agg[m]["host"])

    for m, a in agg.items():
        print(f"{m:14s} steps {a['steps']:5d}  forward/step {a['fwd'] / a['steps']:6.2f} ms  host/step "
              f"{a['host'] / a['steps']:5.2f} ms  x ar as run {speed(m, 1) / speed('ar', 1):.3f}  "
              f"at the floor {speed(m, scale) / speed('ar', scale):.3f}")


if __name__ == "__main__":
    main()
