#!/usr/bin/env bash
# The session's start code (726ae86, a worktree) against this code, end to end on the default
# GGUF (native weights, 2 threads): batch 8 (--batch-size 8 --limit 8, 40 prompts) once each,
# then batch 1 (--limit 1) alternated twice.
#   git worktree add /work/wt-s5 726ae86
#   bash bench/results/2026-11-28-cpu-ranked-head/ab.sh OUTDIR
# (ab/b8-before-2 and ab/b8-now-2: its two batch-8 commands again, run at the session's end)
set -euo pipefail
OUT=$(realpath -m "${1:-out/ab}")
PY=${PY:-$PWD/.venv/bin/python}
M="--methods ar,pld,lookahead+pld,suffix,hybrid"
(cd /work/wt-s5 && PYTHONPATH=/work/wt-s5 "$PY" bench/run.py --batch-size 8 --limit 8 $M --out "$OUT/b8-before")
"$PY" bench/run.py --batch-size 8 --limit 8 $M --out "$OUT/b8-now"
for round in 1 2; do
  (cd /work/wt-s5 && PYTHONPATH=/work/wt-s5 "$PY" bench/run.py --limit 1 $M --out "$OUT/before-$round")
  "$PY" bench/run.py --limit 1 $M --out "$OUT/now-$round"
done
