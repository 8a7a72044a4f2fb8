#!/bin/bash
# --compare-hf --limit 2 on the session's start code (06a875e, a worktree in $BEFORE) and on this
# code ($NOW: a worktree of 09b95ed), back to back, ROUNDS rounds (default 1), each run planning
# with the pinned step-cost curve pinned_step_cost.json (../2026-11-28-cpu-one-step/'s copy), so
# that the plans follow one curve and the forwards show what changed; round r runs "after" first
# where r is even (FIRST=N: the first round's number). Run from the repository root.
set -e
OUT=${OUT:-bench/results/2026-11-28-cpu-side-off}
CURVE=$OUT/pinned_step_cost.json
BEFORE=${BEFORE:-/work/wt-before}
FIRST=${FIRST:-1}
for round in $(seq $FIRST $((FIRST + ${ROUNDS:-1} - 1))); do
sides="before after"; [ $((round % 2)) = 0 ] && sides="after before"
for side in $sides; do
  dir=${NOW:-$PWD}; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --compare-hf --limit 2 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost "$OLDPWD/$CURVE" \
      --out "$OLDPWD/$OUT/compare-hf-$side-$round" > /dev/null 2>&1)
  echo "$side $round done $(date +%T)"
done
done
