#!/usr/bin/env bash
# Batch 8 end to end (--batch-size 8 --limit 8: 40 prompts, 5 batches), the session's start code
# (58ba435, a worktree) then this code, one round each.
#   bash bench/results/2026-11-27-cpu-host-glue/b8.sh OUTDIR
set -euo pipefail
OUT=${1:-out/b8}
PY=${PY:-$PWD/.venv/bin/python}
ARGS="--batch-size 8 --limit 8 --methods ar,pld,lookahead+pld,suffix,hybrid"
(cd /work/wt-s5 && PYTHONPATH=/work/wt-s5 "$PY" bench/run.py $ARGS --out "$OLDPWD/$OUT/before")
"$PY" bench/run.py $ARGS --out "$OUT/now"
