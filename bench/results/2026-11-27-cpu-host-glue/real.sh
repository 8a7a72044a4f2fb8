#!/usr/bin/env bash
# End to end with the real forward (the default GGUF, its default native weights, 2 threads):
# the session's start code (58ba435, a worktree), this code, and this code on the Python reference
# host path (SPECDEC_HOST=ref), alternated twice.
#   git worktree add /work/wt-s5 58ba435
#   bash bench/results/2026-11-27-cpu-host-glue/real.sh OUTDIR
set -euo pipefail
OUT=${1:-out/real}
PY=${PY:-$PWD/.venv/bin/python}
ARGS="--limit 1 --methods ar,pld,lookahead+pld,suffix,hybrid"
for round in 1 2; do
  (cd /work/wt-s5 && PYTHONPATH=/work/wt-s5 "$PY" bench/run.py $ARGS --out "$OLDPWD/$OUT/before-$round")
  "$PY" bench/run.py $ARGS --out "$OUT/now-$round"
  SPECDEC_HOST=ref "$PY" bench/run.py $ARGS --out "$OUT/reference-$round"
done
