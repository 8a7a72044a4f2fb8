#!/usr/bin/env bash
# Host work per step: this session's start code (8e680bf, in a worktree: the compiled planner and
# packing of the run before) against this code's compiled and reference paths, alternated twice;
# each table keeps the fastest of 3 rounds. Both codes replay the same answers.
#   git worktree add /work/wt-start 8e680bf
#   bash bench/results/2026-11-27-cpu-host-drafting/ab.sh "--limit 1" > out.txt
set -euo pipefail
ARGS=${1:-"--limit 1"}
TAG=${TAG:-}  # answers file per prompt set
PY=${PY:-.venv/bin/python}
for round in 1 2; do
  echo "== round $round: start code"
  (cd /work/wt-start && PYTHONPATH=/work/wt-start "$OLDPWD/$PY" bench/host_step.py --paths compiled --answers /tmp/host_step_answers$TAG.json $ARGS)
  echo "== round $round: this code"
  "$PY" bench/host_step.py --paths compiled,reference --answers /tmp/host_step_answers$TAG.json $ARGS
done
