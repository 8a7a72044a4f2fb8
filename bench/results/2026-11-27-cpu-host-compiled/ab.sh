#!/usr/bin/env bash
# Host work per step: the session's start code (0e4a806, in a worktree, with this session's
# bench/host_step.py copied in: it falls back to the one path there is) against this code's
# compiled and reference paths, alternated twice; each table keeps the fastest of 3 rounds.
#   git worktree add /work/wt-base 0e4a806 && cp bench/host_step.py /work/wt-base/bench/
#   bash bench/results/2026-11-27-cpu-host-compiled/ab.sh "--limit 1" > out.txt
set -euo pipefail
ARGS=${1:-"--limit 1"}
TAG=${TAG:-}  # answers file per prompt set: both codes replay the same answers
PY=${PY:-.venv/bin/python}
for round in 1 2; do
  echo "== round $round: start code"
  (cd /work/wt-base && PYTHONPATH=/work/wt-base "$OLDPWD/$PY" bench/host_step.py --paths reference --answers /tmp/host_step_answers$TAG.json $ARGS)
  echo "== round $round: this code"
  "$PY" bench/host_step.py --paths compiled,reference --answers /tmp/host_step_answers$TAG.json $ARGS
done
