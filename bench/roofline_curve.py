"""A step-cost curve at this machine's measured roofline, to play with ``bench/run.py --emulate-cost``.

How fast could speculation be on this machine if every forward ran at its floor? The floor of a
forward is the larger of its bytes (the weights once, each sequence's keys and values) at the
measured read bandwidth and its flops (products, attention) at the measured FMA peak
(``models.cost.Roofline``). Emulation can only slow a forward down (the host sleeps until the
forward has taken the curve's time), so the curve written is the floor times a scale at which
it is slower than this machine at every step size: the machine's own curve is measured here and
the scale is the largest ratio of the two, times a margin. A run that plays the file then
decodes with forwards of exactly the roofline's shape, and the planner plans with it; the
host's work keeps its real time, which at the scaled-up forwards weighs less than it would at
the real floor. So the speedups such a run measures bound from above what kernels at the
roofline could reach with the same drafters and planner on this machine.

    python bench/roofline_curve.py --out bench/out/roofline.json
    python bench/run.py --emulate-cost bench/out/roofline.json --methods ar,pld,suffix,hybrid --limit 4

A lower read bandwidth makes the one-token floor longer and so the curve flatter (a wide step
nearly free): ``--bandwidth`` pins the bandwidth (the host's slowest memory state gives the
most favourable curve, the strongest bound); the default is what is measured now.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from models.cost import GRID, LONG_GRID, Roofline, measure_step_cost  # noqa: E402


def model_roofline(model, peak_gflops: float, bandwidth_gbs: float) -> Roofline:
    """The floor's numbers for a loaded model (its dtype's bytes)."""
    from bench.model_speed import product_flops, weight_bytes

    cfg = model.cfg
    layers, head = product_flops(model)
    elem = next(model.parameters()).element_size()
    return Roofline(weight_bytes=weight_bytes(model), row_flops=layers + head,
                    attn_flops=4 * cfg.num_layers * cfg.num_heads * cfg.head_dim,
                    kv_bytes=2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem,
                    peak_gflops=peak_gflops, bandwidth_gbs=bandwidth_gbs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="as bench/run.py's --model (default: the embedded model)")
    p.add_argument("--bandwidth", type=float, default=None, help="read bandwidth in GB/s (default: measured now)")
    p.add_argument("--peak", type=float, default=None, help="FMA peak in GFLOP/s (default: measured now, the widest "
                                                             "vector width's)")
    p.add_argument("--scale", type=float, default=None,
                   help="the floor's multiple the curve takes (default: this machine's largest forward / floor "
                        "ratio times --margin)")
    p.add_argument("--margin", type=float, default=1.15, help="over the largest ratio (default 1.15: drift)")
    p.add_argument("--out", type=Path, default=Path("bench/out/roofline_step_cost.json"))
    args = p.parse_args(argv)
    for name in ("bandwidth", "peak", "scale"):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            p.error(f"--{name} must be a number > 0, got {v}")
    if not (math.isfinite(args.margin) and args.margin >= 1):
        p.error(f"--margin must be >= 1, got {args.margin}")
    if args.out.is_dir():
        p.error(f"--out {args.out} is a folder: give a file name")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from kernels import skinny
    from models.loader import load_model

    if not skinny.available():
        raise SystemExit(f"the roofline probes need the CPU kernels: {skinny.unavailable_reason()}")
    model = load_model(args.model).model
    widths = [256] + ([512] if "avx512f" in skinny.cpu_flags() else [])
    peak = args.peak or max(max(skinny.fma_peak_gflops(b) for _ in range(3)) for b in widths)
    if args.bandwidth:
        bw = args.bandwidth
    else:
        buf = torch.ones(128 << 20)
        bw = max(skinny.read_bandwidth_gbs(buf) for _ in range(3))
        del buf
    roof = model_roofline(model, peak, bw)
    real = measure_step_cost(model)
    floor = roof.step_cost(1.0, real.context, real.long_context or 4 * real.context)
    ratios = [r / f for r, f in zip(real.ms, floor.ms)] + [r / f for r, f in zip(real.long_ms, floor.long_ms)]
    scale = args.scale or math.ceil(max(ratios) * args.margin * 20) / 20
    cost = roof.step_cost(scale, real.context, real.long_context or 4 * real.context)
    measured_bw = "given" if args.bandwidth else "measured"
    origin = (f"bench/roofline_curve.py: {args.model}'s floor on this machine ({peak:.0f} GFLOP/s measured, "
              f"{bw:.1f} GB/s {measured_bw}; weights {roof.weight_bytes / 1e9:.3f} GB) x {scale:g}, at which it is "
              f"slower than this machine's measured curve at every step size (largest ratio {max(ratios):.2f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from dataclasses import asdict
    args.out.write_text(json.dumps({"cost": asdict(cost), "origin": origin}, indent=1))
    print(origin)
    print("| step tokens | this machine ms | floor ms | machine / floor | emulated ms | emulated x one-token |")
    print("|---:|---:|---:|---:|---:|---:|")
    for t, r, f, e in zip(GRID, real.ms, floor.ms, cost.ms):
        print(f"| {t} | {r:.1f} | {f:.1f} | {r / f:.2f} | {e:.1f} | {e / cost.ms[0]:.2f} |")
    for t, r, f in zip(LONG_GRID, real.long_ms, floor.long_ms):
        print(f"| {t} (context {real.long_context}) | {r:.1f} | {f:.1f} | {r / f:.2f} | {scale * f:.1f} | |")
    print(f"wrote {args.out}")
    return {"scale": scale, "peak": peak, "bandwidth": bw, "ratios": ratios}


if __name__ == "__main__":
    main()
