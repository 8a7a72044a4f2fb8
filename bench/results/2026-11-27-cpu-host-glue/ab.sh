#!/usr/bin/env bash
# Host work per step (bench/host_step.py, the oracle in place of the forward): this session's start
# code (58ba435, a worktree) against this code, compiled path, alternated twice; each table keeps
# the fastest of 3 rounds. Both codes replay the same answers.
#   git worktree add /work/wt-s5 58ba435
#   bash bench/results/2026-11-27-cpu-host-glue/ab.sh "--limit 1" > out.txt
ARGS=${1:-"--limit 1"}
TAG=${TAG:-}  # answers file per prompt set
PY=${PY:-$PWD/.venv/bin/python}
for round in 1 2; do
  echo "== round $round: before"
  (cd /work/wt-s5 && PYTHONPATH=/work/wt-s5 "$PY" bench/host_step.py --paths compiled \
      --answers /tmp/host_step_answers$TAG.json $ARGS) | grep -v "^|---"
  echo "== round $round: now"
  "$PY" bench/host_step.py --paths compiled --answers /tmp/host_step_answers$TAG.json $ARGS | grep -v "^|---"
done
