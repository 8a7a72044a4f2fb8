#!/usr/bin/env bash
# The Qwen2.5-Coder 1.5B (Q4_K_M GGUF) on the default native weights: the session's start code
# (58ba435, a worktree: every product Q8_0 from fp32) and this code (Q4_K products read natively,
# Q8_0 from fp32 for the rest), alternated. ROUNDS rounds (default 1).
#   git worktree add /work/wt-s5 58ba435
#   bash bench/results/2026-11-27-cpu-q4k/qwen.sh OUTDIR
set -euo pipefail
OUT=${1:-out/qwen}
PY=${PY:-$PWD/.venv/bin/python}
ARGS="--model qwen2.5-coder-1.5b --tasks code,code_edit,chat --limit 1 --max-new-tokens 96 --methods ar,pld"
for round in $(seq 1 "${ROUNDS:-1}"); do
  (cd /work/wt-s5 && PYTHONPATH=/work/wt-s5 "$PY" bench/run.py $ARGS --out "$OLDPWD/$OUT/before-$round")
  "$PY" bench/run.py $ARGS --out "$OUT/now-$round"
done
