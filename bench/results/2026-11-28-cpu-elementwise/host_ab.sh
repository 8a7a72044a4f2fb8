#!/bin/bash
# The host work alone, caches cold: bench/host_step.py --cold $COLD (MB, default 100) on the session's start code
# (3dbaae7, a worktree in $BEFORE, run with this host_step.py) and now, alternated ROUNDS times
# (default 4), each the fastest of REPEATS interleaved rounds (default 3).
# Run from the repository root; writes host_ab.txt beside this script.
HERE=bench/results/2026-11-28-cpu-elementwise
BEFORE=${BEFORE:-/work/wt-s10}
ANSWERS=${ANSWERS:-/tmp/host_step_answers.json}
cp bench/host_step.py "$BEFORE/bench/host_step.py"
COLD=${COLD:-100}
OUTFILE=$HERE/host_ab.txt
: > $OUTFILE
for round in $(seq ${ROUNDS:-4}); do
  sides="before now"; [ $((round % 2)) = 0 ] && sides="now before"
  for side in $sides; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/host_step.py --methods ar,pld,suffix,lookahead+pld,hybrid \
       --cold $COLD --repeats ${REPEATS:-3} --answers "$ANSWERS" 2>&1 | grep "^| [a-z]" | grep -v "| method" | sed "s/^/$side $round /") \
      >> $OUTFILE
  done
done
git -C "$BEFORE" checkout -q bench/host_step.py
