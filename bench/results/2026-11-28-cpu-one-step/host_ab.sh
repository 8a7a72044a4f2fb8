#!/bin/bash
# The host work alone, caches cold: bench/host_step.py --cold $COLD (MB, default 100) on the session's start code
# (51a6f40, a worktree in $BEFORE, run with this host_step.py) and now, alternated ROUNDS times
# (default 4), each the fastest of REPEATS interleaved rounds (default 3).
# Run from the repository root; writes $OUT (default host_ab.txt) beside this script. NOW: the code timed as
# "now" (default: this checkout; a worktree of a commit keeps edits made meanwhile out of the run).
HERE=bench/results/2026-11-28-cpu-one-step
BEFORE=${BEFORE:-/work/wt-s11}
ANSWERS=${ANSWERS:-/tmp/host_step_answers.json}
cp bench/host_step.py "$BEFORE/bench/host_step.py"
COLD=${COLD:-100}
OUTFILE=$HERE/${OUT:-host_ab.txt}
: > $OUTFILE
for round in $(seq ${ROUNDS:-4}); do
  sides="before now"; [ $((round % 2)) = 0 ] && sides="now before"
  for side in $sides; do
    dir=${NOW:-$PWD}; [ $side = before ] && dir=$BEFORE
    (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/host_step.py --methods ${METHODS:-ar,pld,suffix,lookahead+pld,hybrid,recycle,lookahead} \
       --cold $COLD --repeats ${REPEATS:-3} --answers "$ANSWERS" 2>&1 | grep "^| [a-z]" | grep -v "| method" | sed "s/^/$side $round /") \
      >> $OUTFILE
  done
done
git -C "$BEFORE" checkout -q bench/host_step.py
