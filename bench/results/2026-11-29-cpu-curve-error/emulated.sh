#!/bin/bash
# The planner before (f5b39ca, a worktree in $BEFORE) and after 65e758e with the forwards' time
# played from the steep-state curve (--emulate-cost bench/data/step_cost_steep.json: every step
# padded to it, so only the host's work varies) and the planner given curves/{exact,slow,taper}.json
# (curves.py) as its curve: the same forwards, a planner's curve right, a multiple of them, or
# overpricing one-token steps most. ROUNDS rounds (default 2), the codes alternated; with
# SLOPEFREE (a worktree of 65e758e with the learnt slope's floor at zero removed, slope_free.diff) a
# third code. Run from the repository root.
set -e
OUT=bench/results/2026-11-29-cpu-curve-error
BEFORE=${BEFORE:-/work/wt-b}
SIDES="before after"; [ -n "$SLOPEFREE" ] && SIDES="before after slopefree"
for r in $(seq ${ROUNDS:-2}); do for curve in exact slow taper; do for side in $SIDES; do
  [ -d "$OUT/emu$curve$r-$side" ] && continue  # done in an earlier call
  dir=$PWD; [ $side = before ] && dir=$BEFORE; [ $side = slopefree ] && dir=$SLOPEFREE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --limit 1 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --emulate-cost "$OLDPWD/bench/data/step_cost_steep.json" \
      --step-cost "$OLDPWD/$OUT/curves/$curve.json" --out "$OLDPWD/$OUT/emu$curve$r-$side" > /dev/null 2>&1)
  echo "emu$curve$r-$side done $(date +%T)"
done; done; done
