#!/bin/bash
# --compare-hf --limit 2 on the session's start code (47f09fd, in $BEFORE) and on this code, back to
# back, ROUNDS rounds (default 1), each run planning with the pinned step-cost curve
# pinned_step_cost.json (measured on this machine by `bench/run.py --methods ar --limit 1` at the
# session's code; the host's time still learnt from the wall clock), so that only the code
# differs. Run from the repository root.
set -e
OUT=${OUT:-bench/results/2026-11-28-cpu-fewer-calls}
CURVE=$OUT/pinned_step_cost.json
BEFORE=${BEFORE:-/work/wt-s8}
for round in $(seq ${ROUNDS:-1}); do
for side in before after; do
  dir=$PWD; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --compare-hf --limit 2 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost "$OLDPWD/$CURVE" \
      --out "$OLDPWD/$OUT/compare-hf-$side-$round" > /dev/null 2>&1)
  echo "$side $round done $(date +%T)"
done
done
