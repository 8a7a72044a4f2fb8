#!/bin/bash
# --compare-hf --limit 2 on the session's start (adee115, a worktree in $BEFORE) and on this code, back to
# back, one round, both planning with ../2026-11-28-cpu-side-off/pinned_step_cost.json. The CPU path changed
# by glue.paths alone this session (the exact path's changes run on the Triton backend only).
# Run from the repository root.
set -e
OUT=bench/results/2026-11-29-cpu-greedy-walks
CURVE=bench/results/2026-11-28-cpu-side-off/pinned_step_cost.json
BEFORE=${BEFORE:-/work/wt-start}
for side in before after; do
  dir=$PWD; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --compare-hf --limit 2 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost "$OLDPWD/$CURVE" \
      --out "$OLDPWD/$OUT/compare-hf-$side" > /dev/null 2>&1)
  echo "$side done $(date +%T)"
done
