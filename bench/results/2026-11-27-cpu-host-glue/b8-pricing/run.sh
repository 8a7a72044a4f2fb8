#!/usr/bin/env bash
# Does pricing a batch step right make batch 8 pay? The same batch-8 command planned with the curve
# b8/now measured (curve-orig.json: +0.42 ms per extra sequence) and with that curve's per-sequence
# cost raised to 0.8 ms (curve-seq08.json), which brings the planner's predicted forward to what the
# step clock measures at batch 8. One round each, back to back (this code, 500bd6e).
set -euo pipefail
D=bench/results/2026-11-27-cpu-host-glue/b8-pricing
for v in orig seq08; do
  .venv/bin/python bench/run.py --batch-size 8 --limit 8 --methods ar,pld,hybrid --step-cost $D/curve-$v.json \
      --out $D/$v
done
