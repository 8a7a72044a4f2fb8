#!/bin/bash
# --batch-size 8 --limit 8 on the code before the critical-path rule (470e979, a worktree in $BEFORE)
# and on this code, back to back, ROUNDS rounds (default 2; round r runs "after" first where r is
# even; FIRST=N: the first round's number), each planning with the pinned step-cost curve. Run from the repository root.
set -e
OUT=${OUT:-bench/results/2026-11-29-cpu-critical-path}
BEFORE=${BEFORE:-/work/wt-before}
FIRST=${FIRST:-1}
for round in $(seq $FIRST $((FIRST + ${ROUNDS:-2} - 1))); do
sides="before after"; [ $((round % 2)) = 0 ] && sides="after before"
for side in $sides; do
  dir=$PWD; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --batch-size 8 --limit 8 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost "$OLDPWD/$OUT/pinned_step_cost.json" \
      --out "$OLDPWD/$OUT/$side-$round" > /dev/null 2>&1)
  echo "$side $round done $(date +%T)"
done
done
