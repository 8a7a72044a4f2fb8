#!/usr/bin/env bash
# End to end with the real forward (the default GGUF, its default native weights, 2 threads):
# the session's start code (6f1f089, a worktree) and this code, alternated twice.
#   git worktree add /work/wt-before 6f1f089
#   bash bench/results/2026-11-27-cpu-host-staging/real.sh OUTDIR
set -euo pipefail
OUT=${1:-out/real}
PY=${PY:-$PWD/.venv/bin/python}
ARGS="--limit 1 --methods ar,pld,lookahead+pld,suffix,hybrid"
for round in 1 2; do
  (cd /work/wt-before && PYTHONPATH=/work/wt-before "$PY" bench/run.py $ARGS --out "$OLDPWD/$OUT/before-$round")
  "$PY" bench/run.py $ARGS --out "$OUT/now-$round"
done
