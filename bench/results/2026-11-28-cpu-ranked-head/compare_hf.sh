#!/bin/bash
# --compare-hf --limit 2 on the session's start code (726ae86, in $BEFORE) and on this code, back to
# back, one round each. Run from the repository root.
set -e
OUT=${OUT:-bench/results/2026-11-28-cpu-ranked-head}
BEFORE=${BEFORE:-/work/wt-s5}
for side in before after; do
  dir=$PWD; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --compare-hf --limit 2 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --out "$OLDPWD/$OUT/compare-hf-$side" > /dev/null 2>&1)
  echo "$side done"
done
