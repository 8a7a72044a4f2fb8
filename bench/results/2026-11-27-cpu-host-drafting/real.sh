#!/usr/bin/env bash
# With the real forward (fp32, the default model, 5 prompts, 2 interleaved repeats): this
# session's start code (8e680bf in /work/wt-start), this code's compiled path and its reference
# path (SPECDEC_HOST=ref), one after the other; then this code at batch 8 (40 prompts).
#   bash bench/results/2026-11-27-cpu-host-drafting/real.sh
set -euo pipefail
M=ar,pld,lookahead,lookahead+pld,recycle,suffix,hybrid
PY=/work/main/.venv/bin/python
OUT=${OUT:-/tmp/host-drafting}
(cd /work/wt-start && PYTHONPATH=/work/wt-start $PY bench/run.py --weights fp32 --limit 1 --repeats 2 --methods $M --out $OUT/start)
$PY bench/run.py --weights fp32 --limit 1 --repeats 2 --methods $M --out $OUT/compiled
SPECDEC_HOST=ref $PY bench/run.py --weights fp32 --limit 1 --repeats 2 --methods $M --out $OUT/reference
$PY bench/run.py --weights fp32 --limit 8 --batch-size 8 --methods ar,pld,lookahead+pld,suffix,hybrid --out $OUT/batch8
