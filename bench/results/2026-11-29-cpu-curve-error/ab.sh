#!/bin/bash
# The planner before (f5b39ca, a worktree in $BEFORE) and after 65e758e (the time beyond the curve
# may be below zero), alternated: compare-hf --limit 2 with the pinned curve (ROUNDS_HF, default 2),
# --limit 1 planning with the curve the run measures or finds cached (ROUNDS_FREE, default 3), and
# batches of 8 with the pinned curve (ROUNDS_B8, default 2). Run from the repository root.
set -e
OUT=bench/results/2026-11-29-cpu-curve-error
CURVE=$PWD/bench/results/2026-11-28-cpu-side-off/pinned_step_cost.json
BEFORE=${BEFORE:-/work/wt-b}
run() {  # side name args...
  local side=$1 name=$2; shift 2
  local dir=$PWD; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py "$@" --out "$OLDPWD/$OUT/$name-$side" \
      > /dev/null 2>&1)
  echo "$name-$side done $(date +%T)"
}
for r in $(seq ${ROUNDS_HF:-2}); do for side in before after; do
  run $side hf$r --compare-hf --limit 2 --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost "$CURVE"
done; done
for r in $(seq ${ROUNDS_FREE:-3}); do for side in before after; do
  run $side free$r --limit 1 --methods ar,pld,lookahead+pld,suffix,hybrid
done; done
for r in $(seq ${ROUNDS_B8:-2}); do for side in before after; do
  run $side b8-$r --batch-size 8 --limit 8 --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost "$CURVE"
done; done
